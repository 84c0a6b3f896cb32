"""How the launcher tells a PS-mode process its role (kept free of TensorFlow imports)."""

from tensorflow_elastic.runtime import RUN_ID_ENV as JOB_ENV

ROLE_ENV = "TFE_PS_ROLE"
ADDRESS_ENV = "TFE_PS_ADDRESS"
CHECKPOINT_DIR_ENV = "TFE_PS_CHECKPOINT_DIR"
PS = "ps"
WORKER = "worker"
ROLES = (PS, WORKER)

__all__ = ["ADDRESS_ENV", "CHECKPOINT_DIR_ENV", "JOB_ENV", "PS", "ROLES", "ROLE_ENV", "WORKER"]
