"""Markdown tables for the command line: readable in a terminal, pasteable into a README."""


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table with columns padded to a common width."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells) -> str:
        return "| " + " | ".join(str(cell).ljust(width) for cell, width in zip(cells, widths)) + " |"

    separator = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([line(header), separator, *(line(row) for row in rows)])
