"""Old path of calm_core.models.real_pair, kept for outside code and for `python -m calm_core.real_pair`."""
import sys

from .models import real_pair as _real_pair

if __name__ == "__main__":
    sys.exit(_real_pair.main())
sys.modules[__name__] = _real_pair
