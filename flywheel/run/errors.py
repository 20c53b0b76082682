"""The command line's own errors, in a leaf module (nothing heavy imported), so that a bad
command line is refused before torch or Lightning load: `PreflightError` (a setting, input or
output that would fail the run later) and `CheckpointReadError` (a checkpoint that cannot be
read). flywheel.run.preflight and flywheel.run.checkpoint raise them and name them too."""


class PreflightError(ValueError):
    """A setting, input or output that would fail the run later: the message names the flag
    and the fix. The command line prints it as one line, without a traceback."""


class CheckpointReadError(RuntimeError):
    """A checkpoint file exists but cannot be read (truncated, corrupt, or not a checkpoint)."""


class GeneratorFailure(RuntimeError):
    """The generator failed mid-run past its own retries (a vLLM server that died and could not be
    restarted, a weight push that failed halfway): the message says what failed, which checkpoint
    resumes the run, and the command. The command line prints it as one line (exit 1)."""
