"""What ships inside the package: the Hydra configs (``conf/``) and the bundled samples (``data/``).

They live in the package, not beside it, so a wheel installed anywhere runs ``python -m flowllm`` as a checkout
does. A relative path a user gives (``dataset.path``, an emulator script) is looked up from the working
directory first, then among these bundled files.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_ROOT / "conf"
PROVIDER_CONFIG_DIR = CONFIG_DIR / "provider"


def bundled(value: str | Path) -> Path:
    """``value`` as given when it exists (or is absolute), else the bundled file of that name if there is one."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path
    candidate = PACKAGE_ROOT / path
    return candidate if candidate.exists() else path
