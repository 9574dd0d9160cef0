"""Built-in backends, registered on first use of the registry. Importing a backend's package never
fails for missing hardware or packages: it reports that through `is_available()`.
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
