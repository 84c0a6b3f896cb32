"""Why the PS refused a request: the first word of the error details, shared by both ends."""

WRONG_JOB = "wrong_job"
UNKNOWN_WORKER = "unknown_worker"
MALFORMED = "malformed"
WRONG_SHAPE = "wrong_shape"
FUTURE_VERSION = "future_version"
BAD_CONFIG = "bad_config"
