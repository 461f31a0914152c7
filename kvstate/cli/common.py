"""What every ``kvstate`` subcommand shares: the exit codes, the parser that exits 2 on bad
usage, argument types that validate at parse time, loading a spec, the pure-build notice."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from kvstate.spec.errors import SpecError

# The exit-code contract (``kvstate --help`` prints it): CI gates on these.
EXIT_OK = 0  # every obligation holds / the run conforms / the kill rate is met
EXIT_FAIL = 1  # an obligation or check fails (a counterexample, a nonconformance, a low kill rate)
EXIT_USAGE = 2  # bad usage or malformed input: one line on stderr, nothing run
EXIT_UNDECIDED = 3  # nothing failed, but not everything was decided (timeouts, budget spent)
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # interrupted: the partial report is printed first

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    all good: every obligation holds, the fuzz run conforms, the kill rate is met
  {EXIT_FAIL}    a property fails: a counterexample, a nonconformance, a kill rate below the gate
  {EXIT_USAGE}    bad usage or malformed input (options, spec module, trace, blob); one line on stderr
  {EXIT_UNDECIDED}    undecided: no failure, but an obligation is 'unknown' (timed out, or the
       --budget ran out); unknown is not a pass. mutate without --min-kill-rate: the
       --budget left mutants unchecked
  {EXIT_SIGINT}  interrupted by SIGINT ({EXIT_SIGTERM}: SIGTERM) after printing the partial report"""

# the optional dependencies (pyproject.toml's extras) a command may need
EXTRAS = {
    "networkx": "prove",
    "pebble": "prove",
    "filelock": "prove",
    "hypothesis": "fuzz",
    "numba": "kernels",
    "torch": "fuzz",
}


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one readable line and exit code 2, and an epilog
    computed only when help is printed (``epilog_fn``: listing the seeded bugs imports the
    allocator, which a plain run of another command should not pay for)."""

    def __init__(self, *args: Any, epilog_fn: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn

    def format_help(self) -> str:
        if self.epilog_fn is not None:
            self.epilog = self.epilog_fn()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def usage_error(message: str) -> int:
    print(f"kvstate: error: {message}", file=sys.stderr)
    return EXIT_USAGE


# ---- argument types: validated while parsing, so bad values never reach a command ----------
def positive_int(text: str) -> int:
    """An integer >= 1 (``--pool 0``, ``-j 0`` are errors, never silently replaced)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return v


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0")
    return v


def seconds(text: str) -> float:
    """A duration in seconds, >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds >= 0")
    return v


def rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be within 0..1")
    return v


def spec_names() -> list[str]:
    from kvstate.spec import TABLES

    return sorted(TABLES)


SPEC_HELP = "a built-in spec ({}) or module:attr naming a Table or a function returning one"


def load_table(spec: str) -> Any:
    """A built-in spec name, or ``module:attr`` naming a Table or a function returning one.

    Anything that goes wrong loading it (no module, a syntax error in it, a factory that
    raises, an object that is not a Table) is a :class:`SpecError`: one line, exit 2."""
    from kvstate.spec import Table, table_named

    if ":" not in spec:
        return table_named(spec)
    mod_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except SyntaxError as exc:
        where = f"{Path(exc.filename or '?').name}, line {exc.lineno}"
        raise SpecError(f"cannot load spec {spec!r}: syntax error ({where}): {exc.msg}") from exc
    except Exception as exc:  # noqa: BLE001 - whatever the module raises while loading
        raise SpecError(f"cannot load spec {spec!r}: {type(exc).__name__}: {exc}") from exc
    if callable(obj) and not isinstance(obj, Table):
        try:
            obj = obj()
        except SpecError:
            raise
        except Exception as exc:  # noqa: BLE001 - a factory that raises is malformed input
            raise SpecError(f"spec factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Table):
        raise SpecError(f"spec {spec!r} is not a kvstate.spec.Table (got {type(obj).__name__})")
    return obj


# ---- the request path's build ----------------------------------------------------------------
def _native() -> ModuleType | None:
    """``impl/native.py`` loaded alone: what it says needs no torch (the package would)."""
    try:
        spec = importlib.util.find_spec("kvstate.impl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "native.py"
    loader = importlib.util.spec_from_file_location("kvstate_native_probe", path)
    if loader is None or loader.loader is None:
        return None
    mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(mod)
    return mod


def build_state() -> tuple[bool, str]:
    """(compiled, why): whether the request path will run compiled in this process, and why not."""
    native = _native()
    if native is None:
        return False, "kvstate.impl not found"
    if native.pure_requested():
        return False, f"{native.ENV_PURE}=1 is set"
    if not native.extensions():
        return False, (
            "no compiled extensions: the install skipped or failed the mypyc build "
            "(reinstall with `pip install -v -e .` to see why)"
        )
    why = native.stale()
    if why:
        return False, "the compiled build is stale: " + "; ".join(why)
    return True, f"{len(native.COMPILED)} modules compiled with mypyc"


_NOTICED = [False]


def pure_build_notice() -> None:
    """Say once, on stderr, when this process runs the allocator's pure-Python build (several
    times slower on the request path than the default compiled one)."""
    if _NOTICED[0]:
        return
    _NOTICED[0] = True
    compiled, why = build_state()
    if not compiled:
        print(
            f"kvstate: running the pure-Python build of the request path ({why})", file=sys.stderr
        )


def version_text() -> str:
    from kvstate import __version__

    compiled, why = build_state()
    build = "compiled" if compiled else "pure Python"
    return f"kvstate {__version__} (Python {sys.version.split()[0]}; request path: {build}, {why})"
