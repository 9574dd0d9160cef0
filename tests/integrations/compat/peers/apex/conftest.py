"""apex's test imports `torch.testing._internal.common_utils`, which needs `expecttest` (in the
test extra; a GPU host's own Python may lack it): without it the file is skipped, saying so."""

import pytest

pytest.importorskip("expecttest", reason="apex's test needs expecttest for torch.testing._internal "
                                         "(pip install -e '.[test]')")
