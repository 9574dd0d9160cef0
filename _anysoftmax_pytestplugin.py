"""pytest plugin of anysoftmax's conformance kit: `pytest --anysoftmax-backend NAME` adds one test
per conformance check of backend NAME to the session (registered through the `pytest11` entry
point when anysoftmax is installed; `-p no:anysoftmax` turns it off).

    pytest --anysoftmax-backend mine                      # the plugin's backend, by name
    pytest --anysoftmax-backend mine --anysoftmax-plugin my_pkg.backend --anysoftmax-quick

A top-level module, not part of the `anysoftmax` package (hypothesis's pytest plugin is built
the same way): pytest imports it in every session of an environment that has anysoftmax, and
importing the package would import torch and fix settings that tests set first (the project's
own conftest sets $ANYSOFTMAX_POISON_OUTPUTS before anysoftmax is imported). Nothing is
imported until the option is given.
"""

from __future__ import annotations

import zlib

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("anysoftmax", "anysoftmax conformance kit")
    group.addoption("--anysoftmax-backend", action="append", default=[], metavar="NAME",
                    help="add the conformance checks of this anysoftmax backend as tests (repeatable)")
    group.addoption("--anysoftmax-plugin", action="append", default=[], metavar="MODULE[:ATTR]",
                    help="import MODULE first (it registers its backends), or register MODULE:ATTR")
    group.addoption("--anysoftmax-device", default=None, metavar="D",
                    help="where the checks' inputs live (default: the backend's first device present, else cpu)")
    group.addoption("--anysoftmax-quick", action="store_true", help="one case of each kind (float32, bfloat16)")
    group.addoption("--anysoftmax-seed", type=int, default=None, metavar="N",
                    help="the checks' data seed (default: random, shown in the header)")


def _wanted(config) -> list[str]:
    return config.getoption("anysoftmax_backend", default=[]) or []


def pytest_configure(config):
    if not _wanted(config):
        return
    import random

    from anysoftmax.plugins import use_interpreter_if_needed
    from anysoftmax.testing.command import load_plugin

    # As the CLI: Triton runs interpreted when no device is here (decided before any kernel).
    config._anysoftmax_note = use_interpreter_if_needed()
    for spec in config.getoption("anysoftmax_plugin"):
        load_plugin(spec)
    seed = config.getoption("anysoftmax_seed")
    config._anysoftmax_seed = random.SystemRandom().randrange(2**31) if seed is None else seed


def pytest_report_header(config):
    if not _wanted(config):
        return None
    note = getattr(config, "_anysoftmax_note", None)
    return [f"anysoftmax conformance: {', '.join(_wanted(config))}, seed {config._anysoftmax_seed} "
            f"(--anysoftmax-seed replays)"] + ([note] if note else [])


class ConformanceItem(pytest.Item):
    """One check of the kit as a test: a refusal is a skip with the backend's reason."""

    def __init__(self, *, check, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.seed = seed

    def runtest(self):
        refusal = self.check.run(zlib.crc32(f"{self.seed}/{self.check.name}".encode()))
        if refusal is not None:
            pytest.skip(refusal)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, AssertionError):
            return f"{self.check.name}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return "anysoftmax-conformance", None, self.name


class ConformanceSuite(pytest.Collector):
    """The checks of one backend on one device."""

    def __init__(self, *, backend: str, device: str, **kwargs):
        super().__init__(**kwargs)
        self.backend, self.device = backend, device

    def collect(self):
        from anysoftmax.testing import conformance_checks

        quick = self.config.getoption("anysoftmax_quick")
        for check in conformance_checks(self.backend, device=self.device, quick=quick):
            yield ConformanceItem.from_parent(self, name=check.name, check=check, seed=self.config._anysoftmax_seed)


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: the added tests are selectable too
def pytest_collection_modifyitems(session, config, items):
    names = _wanted(config)
    if not names:
        return
    from anysoftmax.core import registry
    from anysoftmax.testing import default_device

    known = registry.registered()
    for name in names:
        if name not in known:
            raise pytest.UsageError(f"--anysoftmax-backend {name}: unknown backend; known: {', '.join(known)}")
        device = config.getoption("anysoftmax_device") or default_device(known[name])
        suite = ConformanceSuite.from_parent(session, name=f"anysoftmax-conformance[{name}@{device}]",
                                             nodeid=f"anysoftmax-conformance[{name}@{device}]",
                                             backend=name, device=device)
        items.extend(suite.collect())
