"""How the launcher tells a PS-mode process its role (kept free of TensorFlow imports)."""

ROLE_ENV = "TFE_PS_ROLE"
ADDRESS_ENV = "TFE_PS_ADDRESS"
JOB_ENV = "TFE_RUN_ID"
CHECKPOINT_DIR_ENV = "TFE_PS_CHECKPOINT_DIR"
PS = "ps"
WORKER = "worker"
ROLES = (PS, WORKER)
