"""The roles of a PS-mode process, which the launcher assigns (kept free of TensorFlow imports)."""

from tensorflow_elastic import environment

PS = "ps"
WORKER = "worker"
ROLES = (PS, WORKER)

# Public as tfe.ps.ROLE_ENV / tfe.ps.ADDRESS_ENV: where a PS-mode script finds its role and the PS.
ROLE_ENV = environment.PS_ROLE
ADDRESS_ENV = environment.PS_ADDRESS

__all__ = ["ADDRESS_ENV", "PS", "ROLES", "ROLE_ENV", "WORKER"]
