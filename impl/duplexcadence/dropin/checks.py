"""What every drop-in checks at `wrap`: the object it stands in for and the cadence options it passes on."""
from duplexcadence.errors import InputError


def check_wrapped(name: str, obj, class_name: str, expected: str) -> None:
    """Raises InputError naming `name` unless `obj`'s class (or a base) is called `class_name`."""
    if class_name not in (c.__name__ for c in type(obj).__mro__):
        raise InputError(f"{name}: expected {expected}, got {type(obj).__name__}")


def check_options(options: dict, known) -> None:
    """Raises InputError naming the options the drop-in's cadence session does not take."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"options: {unknown} not taken by the drop-in's cadence session (expected some of "
                         f"{sorted(known)})")
