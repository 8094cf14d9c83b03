"""Mutation testing only (in mutants/, never in the source): a clef-format process that a test starts
(subprocess) during mutmut's stats pass records which mutated functions it reached, so that mutmut runs
the tests that reach a function only through the CLI against that function's mutants too."""
import os

if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("CLEF_MUTMUT_SUBSTATS") \
        and os.environ.get("PYTEST_CURRENT_TEST"):
    import atexit

    def _clef_dump_substats() -> None:
        import json
        import sys
        import uuid
        if "mutmut.state" not in sys.modules:
            return
        from mutmut.state import state
        names = sorted(state()._stats)
        if names:
            test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
            path = os.path.join(os.environ["CLEF_MUTMUT_SUBSTATS"], uuid.uuid4().hex + ".json")
            with open(path, "w") as fh:
                json.dump({"test": test, "names": names}, fh)

    atexit.register(_clef_dump_substats)
