"""Built-in backends, registered on first use of the registry.

Each backend lives in its own package and declares what it supports; importing a backend's
package must never fail because its hardware or optional packages are missing: it reports
that through `is_available()` instead.
"""

from ..core.registry import register
from .cute import CuteBackend
from .torch_eager import TorchBackend
from .triton import TritonBackend
from .triton_ascend import TritonAscendBackend
from .wave import WaveBackend

register(TorchBackend())
register(TritonBackend())
register(TritonAscendBackend())
register(WaveBackend())
register(CuteBackend())
