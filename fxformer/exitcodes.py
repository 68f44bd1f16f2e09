"""Exit statuses of fxformer's commands, read by the launcher and by schedulers (imports nothing).

0   done: training reached num_train_steps (or the command finished)
1   failed: a crash (Python's own status, with a traceback), or a sweep with a row that failed every attempt
2   refused: one sentence on stderr names a mistake the user can fix
75  stopped before the last step (SIGTERM, Ctrl-C, a pre-emption notice), after saving a
    checkpoint: run the same command again to resume (sysexits' EX_TEMPFAIL, "try again")
"""

OK = 0
FAILED = 1
USER_ERROR = 2
STOPPED = 75
