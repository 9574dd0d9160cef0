"""What a device entry asks of a Ray cluster, and which nodes can give it (no Ray import here).

The mapping (docs/ray.md):

- `cuda` entry (NVIDIA or AMD: Ray calls both `GPU`)  -> `num_gpus=1` per worker; when every
  `match` string names a GPU model Ray knows, a node-label selector
  `ray.io/accelerator-type in (...)` (Ray spells models its own way: "H100", "AMD-Instinct-MI300X-OAM").
- `npu` entry (Ascend)                                -> `resources={"NPU": 1}`.
- `cpu` entry                                          -> `num_cpus=1`.
- the entry's own `resources:` (custom node resources, e.g. `{host_a: 1}`) and `labels:`
  (node labels) are added, to pin it to particular hosts.

One worker (Ray actor) holds one such bundle; the number of workers an entry can get is how
many bundles fit on the cluster's alive nodes, counted up front from their total resources.
"""

from __future__ import annotations

RESERVED = ("CPU", "GPU", "memory", "object_store_memory")  # set by `device:`, or Ray's own
LABEL_ACCELERATOR = "ray.io/accelerator-type"


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def check_resources(c, where: str, value) -> dict:
    """A mapping of custom resource names to positive amounts (errors go to checker `c`)."""
    if not isinstance(value, dict):
        c.error(where, f"expected a mapping of Ray resource names to positive amounts, e.g. {{NPU: 1}}; got {value!r}")
        return {}
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            c.error(where, f"a resource name must be a non-empty string, got {k!r}")
        elif k in RESERVED:
            c.error(f"{where}.{k}", f"{k!r} is set by the entry's `device` (cpu: 1 CPU, cuda: 1 GPU); "
                                    f"not allowed here: {', '.join(RESERVED)}")
        elif not _positive(v):
            c.error(f"{where}.{k}", f"an amount must be a positive number, got {v!r}")
        else:
            out[k] = v
    return out


def check_labels(c, where: str, value) -> dict:
    """A mapping of node-label keys to values (strings; Ray's `in(a,b)` / `!x` forms allowed)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                              for k, v in value.items()):
        c.error(where, f"expected a mapping of node-label keys to non-empty strings, "
                       f"e.g. {{ray.io/node-id: ...}} or {{zone: 'in(a,b)'}}; got {value!r}")
        return {}
    return dict(value)


def accelerator_types(match: tuple[str, ...], known: list[str]) -> list[str]:
    """Ray accelerator-type names matching every `match` string (substring, case-insensitive,
    hyphens ignored), or [] when some string names no model Ray knows (no label is then
    required: the worker's own device check decides)."""
    def norm(s: str) -> str:
        return s.lower().replace("-", "").replace(" ", "")

    out: list[str] = []
    for m in match:
        hits = [k for k in known if norm(m) in norm(k)]
        if not hits:
            return []
        out += [h for h in hits if h not in out]
    return out


def ray_options(entry, known_types: list[str] = ()) -> dict:
    """`actor.options(...)` for one worker of `entry` (a schema.DeviceEntry)."""
    kind = entry.device.partition(":")[0]
    opts: dict = {"num_cpus": 1 if kind == "cpu" else 0, "num_gpus": 1 if kind == "cuda" else 0}
    resources = dict(entry.resources)
    if kind == "npu":
        resources.setdefault("NPU", 1)
    if resources:
        opts["resources"] = resources
    labels = dict(entry.labels)
    if kind in ("cuda", "npu") and entry.match and LABEL_ACCELERATOR not in labels:
        types = accelerator_types(entry.match, list(known_types))
        if types:
            labels[LABEL_ACCELERATOR] = f"in({','.join(types)})"
    if labels:
        opts["label_selector"] = labels
    return opts


def demand(opts: dict) -> dict[str, float]:
    """The resources one worker with these options takes (Ray's names)."""
    need = {"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
    return {k: v for k, v in need.items() if v}


def _label_ok(selector: dict, labels: dict) -> bool:
    for key, want in selector.items():
        have = labels.get(key)
        if want.startswith("!in(") and want.endswith(")"):
            if have in want[4:-1].split(","):
                return False
        elif want.startswith("in(") and want.endswith(")"):
            if have not in want[3:-1].split(","):
                return False
        elif want.startswith("!"):
            if have == want[1:]:
                return False
        elif have != want:
            return False
    return True


def capacity(opts: dict, nodes: list[dict]) -> tuple[int, str]:
    """How many workers with `opts` the alive `nodes` (from `ray.nodes()`) can hold at once,
    or (0, why none): the check that keeps an impossible entry from waiting forever."""
    need = demand(opts)
    selector = opts.get("label_selector", {})
    total = 0
    for n in nodes:
        if not n.get("Alive"):
            continue
        have = n.get("Resources", {})
        if not _label_ok(selector, n.get("Labels", {}) or {}):
            continue
        if not need:
            total += 1
            continue
        total += int(min(have.get(k, 0) // v for k, v in need.items()))
    if total:
        return total, ""
    wants = ", ".join(f"{k}: {v:g}" for k, v in need.items()) or "nothing"
    labels = f" and node labels {selector}" if selector else ""
    return 0, (f"not schedulable on the Ray cluster: no alive node has {{{wants}}}{labels} "
               f"({sum(1 for n in nodes if n.get('Alive'))} alive node(s))")
