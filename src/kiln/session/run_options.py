"""`RunOptions`: the options of one `run`, named as in onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import ArgumentTypeError, UsageError
from kiln.runtime.terminate import TerminateFlag
from kiln.session import ort_names


class RunOptions:
    """Options of one `run`, named as in onnxruntime.

    Attributes:
        terminate: set it to True, from any thread, to stop the runs given these
            options: each stops at its next kernel call or Loop iteration with a
            CallError ("main: terminated: the caller set the call's terminate flag").
            It stays True until reset (a run started with it set stops at once, as
            onnxruntime's "Exiting due to terminate flag being set to true"). A
            library compiled before kiln's library metadata version 5 cannot be stopped
            once running: a run started with the flag set is refused the same way, one
            already running goes to its end.
        logid, log_severity_level, log_verbosity_level, only_execute_path_to_fetches:
            accepted for compatibility; kiln does not log runs, and a kiln library
            computes every output of its graph.
    """

    __slots__ = ("_entries", "_flag", "log_severity_level", "log_verbosity_level", "logid",
                 "only_execute_path_to_fetches")

    def __init__(self) -> None:
        self._flag = TerminateFlag()
        self._entries: dict[str, str] = {}
        self.logid = ""
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.only_execute_path_to_fetches = False

    @property
    def terminate(self) -> bool:
        """Whether the runs given these options are asked to stop."""
        return self._flag.is_set

    @terminate.setter
    def terminate(self, value: bool) -> None:
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentTypeError(f"RunOptions.terminate must be a bool, got "
                                    f"{type(value).__name__}")
        if value:
            self._flag.set()
        else:
            self._flag.clear()

    @property
    def flag(self) -> TerminateFlag:
        """The terminate flag the session passes to the library's call."""
        return self._flag

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Keep a run configuration entry (onnxruntime's "run.*" keys); kiln reads none of
        them: they are listed by `get_run_config_entry`."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise ArgumentTypeError("add_run_config_entry takes two strings (key, value), got "
                                    f"{type(key).__name__}, {type(value).__name__}")
        self._entries[key] = value

    def get_run_config_entry(self, key: str) -> str:
        """The value given to `add_run_config_entry(key, ...)`."""
        if key not in self._entries:
            raise UsageError(f"RunOptions does not have configuration with key: {key}")
        return self._entries[key]

    def __getattr__(self, name: str) -> Any:
        raise ort_names.missing("RunOptions", name)
