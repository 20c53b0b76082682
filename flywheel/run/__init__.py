"""A run's lifecycle around the Lightning loop: the command line's own checks and renamed
settings, run settings, pre-flight, checkpoints and resume, preemption and Ctrl-C, the
distributed and DeepSpeed set-up."""
