"""longdoc: question answering over long documents."""
