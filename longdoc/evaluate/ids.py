"""The one rule every task's metric follows for prediction ids that do not match the gold's.

A prediction file whose ids match no gold id, or that leaves gold examples out, is most often
another file (another split, another task, a truncated run): scoring it would print figures that
say nothing true. So such a file is refused, naming a few of the ids and how many there are,
unless the caller allows it (`allow_missing`, `longdoc evaluate --allow-missing`); then the metric
scores it as the task's official script does and warns with the counts. Where the official script
itself refuses such files (Natural Questions, OpenKP), they stay refused.
"""

from collections.abc import Collection, Mapping

from longdoc.errors import OptionError

SHOWN = 5  # ids named in a message


def some_ids(ids: Collection) -> str:
    """A few of `ids` (sorted as text), with how many more there are."""
    shown = sorted(ids, key=repr)[:SHOWN]
    more = len(ids) - len(shown)
    return ", ".join(map(repr, shown)) + (f" and {more} more" if more else "")


def id_mismatch(unknown: Collection, missing: Mapping[str, Collection]) -> list[str]:
    """One phrase per problem: predicted ids that match no gold id (`unknown`); gold ids the
    prediction leaves out, keyed by what they lack ("a prediction", "a predicted answer")."""
    problems = [f"{len(unknown)} predicted id(s) match no gold id: {some_ids(unknown)}"] if unknown else []
    problems += [f"{len(ids)} gold id(s) have no {lacking}: {some_ids(ids)}" for lacking, ids in missing.items() if ids]
    return problems


def check_prediction_ids(pred_path, gold_path, unknown: Collection, missing: Mapping[str, Collection], *,
                         allow_missing: bool) -> None:
    """Refuse a prediction file whose ids do not match the gold's (see the module docstring), unless
    `allow_missing`: then the caller scores it as the official script does, and warns."""
    problems = id_mismatch(unknown, missing)
    if problems and not allow_missing:
        raise OptionError("{pred} does not predict the examples of {gold}: {problems}; give {allow_missing} to "
                          "score it as the official metric does (missing examples count as wrong, unknown ids "
                          "are ignored)", pred=str(pred_path), gold=str(gold_path), problems="; ".join(problems))


def require_gold_ids(pred_path, gold_path, unknown: Collection, missing: Collection, *, official: str,
                     hint: str = "") -> None:
    """Refuse a prediction file without exactly the gold's ids, whatever `allow_missing` says.

    For a metric whose official script refuses such a file (Natural Questions, OpenKP): the
    message names a few of the ids (and `hint`).

    Args:
        pred_path: the prediction file, named in the message.
        gold_path: the gold file, named in the message.
        unknown: predicted ids that match no gold id.
        missing: gold ids the prediction file leaves out.
        official: the name of the official script that refuses such files, e.g. "nq_eval".
        hint: a further sentence for the message (what to do); "": none.

    Raises:
        OptionError: some ids are unknown or missing.
    """
    problems = id_mismatch(unknown, {"prediction": missing})
    if problems:
        raise OptionError("{pred} does not predict the examples of {gold}: {problems}; {official} scores only a file "
                          "with exactly the gold's ids, so {allow_missing} does not apply{hint}", pred=str(pred_path),
                          gold=str(gold_path), problems="; ".join(problems), official=official,
                          hint=f"; {hint}" if hint else "")
