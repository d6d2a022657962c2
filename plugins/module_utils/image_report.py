# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a serving image holds, from the answer of ``vllm_image_probe``'s probe run with
``"report": true``: vLLM, torch, CUDA, NCCL, Ray, flashinfer, fastsafetensors, libibverbs and the
architectures its vLLM registry lists. An item the image lacks is ``None`` (and named in
``absent``), never an error.

Also the one decision an image report feeds: a serving image without libibverbs is refused
where the node's communication environment (host_prep's comm.env) puts NCCL on the RoCE path,
since NCCL's IB transport loads libibverbs at run time and otherwise falls back to sockets.

Pure standard library, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.elf_notes import short_build

FORMAT = 1
# The items of a report, in the order a person reads them.
ITEMS = (
    "vllm",
    "torch",
    "cuda",
    "nccl",
    "ray",
    "flashinfer",
    "fastsafetensors",
    "libibverbs",
)
_LABELS = {
    "vllm": "vLLM",
    "torch": "torch",
    "cuda": "CUDA",
    "nccl": "NCCL",
    "ray": "Ray",
    "flashinfer": "flashinfer",
    "fastsafetensors": "fastsafetensors",
    "libibverbs": "libibverbs",
}
# The distributions that install each Python item, first found wins (flashinfer's wheel is
# flashinfer-python since 0.2; the NCCL wheels name their CUDA).
_DISTRIBUTIONS = {
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "fastsafetensors": ("fastsafetensors",),
}
_NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
_FILE_VERSION = {
    "libnccl": re.compile(r"/libnccl\.so\.(\d+\.\d+\.\d+)$"),
    "libibverbs": re.compile(r"/libibverbs\.so\.(\d+(?:\.\d+)+)$"),
}


def dpkg_versions(stanzas: list[str]) -> dict[str, str]:
    """package -> version of the installed packages among ``/var/lib/dpkg/status`` stanzas
    (a package removed but not purged keeps a stanza whose Status is not ``installed``)."""
    out: dict[str, str] = {}
    for stanza in stanzas or []:
        fields: dict[str, str] = {}
        for line in str(stanza).splitlines():
            key, sep, value = line.partition(":")
            if sep and not line[:1].isspace():
                fields[key.strip()] = value.strip()
        name = fields.get("Package", "").split(":")[0]
        if name and fields.get("Status", "").endswith(" installed") and fields.get("Version"):
            out[name] = fields["Version"]
    return out


def library_files(files: dict[str, str], library: str) -> list[str]:
    """The real files (symbolic links resolved) of ``libnccl`` or ``libibverbs``, sorted."""
    prefix = f"/{library}.so"
    return sorted({real for path, real in (files or {}).items() if prefix in path})


def _file_version(files: list[str], library: str) -> tuple[str | None, str | None]:
    for path in files:
        match = _FILE_VERSION[library].search(path)
        if match:
            return match.group(1), path
    return None, None


def _first(versions: dict, names: tuple[str, ...]) -> tuple[str | None, str | None]:
    for name in names:
        if versions.get(name):
            return versions[name], name
    return None, None


def nccl_of(found: dict) -> dict | None:
    """The image's NCCL: what its torch reports (the library torch runs), else the pip wheel's
    version, else a libnccl file's, else the Debian package's; None when it has none."""
    if found.get("torch_nccl"):
        return {"version": str(found["torch_nccl"]), "source": "torch.cuda.nccl.version()"}
    version, wheel = _first(found.get("distributions") or {}, _NCCL_WHEELS)
    if version:
        return {"version": version, "source": f"the {wheel} package"}
    version, path = _file_version(
        library_files(found.get("library_files") or {}, "libnccl"), "libnccl"
    )
    if version:
        return {"version": version, "source": path}
    packages = dpkg_versions(found.get("dpkg") or [])
    if packages.get("libnccl2"):
        return {"version": packages["libnccl2"], "source": "the libnccl2 package"}
    return None


def libibverbs_of(found: dict) -> dict | None:
    """The image's libibverbs: the Debian package's version, else a library file's."""
    packages = dpkg_versions(found.get("dpkg") or [])
    version, package = _first(packages, ("libibverbs1", "rdma-core"))
    if version:
        return {"version": version, "source": f"the {package} package"}
    version, path = _file_version(
        library_files(found.get("library_files") or {}, "libibverbs"), "libibverbs"
    )
    if version:
        return {"version": version, "source": path}
    return None


def build_report(
    probe: dict,
    architectures: list[str],
    checked: dict | None = None,
    image: str = "",
    image_id: str = "",
) -> dict:
    """The report of one image from the probe's document (``probe["report"]`` present).

    ``architectures``: every architecture the image's registry lists (vLLM's order);
    ``checked``: the wanted ones with their status (``vllm_image_probe.classify``).
    """
    found = probe.get("report")
    if not isinstance(found, dict):
        raise ValueError("the probe's answer has no report: ask it with report=true")
    versions = probe.get("versions") or {}
    distributions = found.get("distributions") or {}
    report: dict[str, object] = {
        "format": FORMAT,
        "image": image,
        "image_id": image_id,
        "python": (probe.get("python") or {}).get("version"),
        "platform": (probe.get("platform") or {}).get("machine"),
        "vllm": versions.get("vllm"),
        "torch": versions.get("torch"),
        "cuda": found.get("torch_cuda") or None,
        "nccl": nccl_of(found),
        "ray": versions.get("ray"),
        "flashinfer": _first(distributions, _DISTRIBUTIONS["flashinfer"])[0],
        "fastsafetensors": _first(distributions, _DISTRIBUTIONS["fastsafetensors"])[0],
        "libibverbs": libibverbs_of(found),
        "files": {
            name: library_files(found.get("library_files") or {}, name)
            for name in ("libnccl", "libibverbs")
        },
        "architectures": list(architectures),
        "wanted": {arch: entry.get("status") for arch, entry in (checked or {}).items()},
    }
    notes = {
        key: found[key] for key in ("torch_error", "torch_nccl_error", "dpkg_error") if key in found
    }
    if notes:
        report["notes"] = notes
    report["absent"] = [item for item in ITEMS if report[item] is None]
    report["summary"] = report_line(report)
    return report


def _shown(value) -> str:
    if value is None:
        return "absent"
    if isinstance(value, dict):
        build = short_build(value.get("build"))
        return str(value.get("version")) + (f" (build {build})" if build else "")
    return str(value)


def with_nccl_build(report: dict, build: dict | None) -> dict:
    """The report with the build of the image's libnccl the ranks map (``elf_notes``' size and
    build ID, read where the ranks run) beside its NCCL version, and its line made again: the
    report itself is made from the image's files alone, which name versions, not builds."""
    if not report or not isinstance(report.get("nccl"), dict) or not build:
        return report
    keep = ("path", "real_path", "size", "build_id", "sha256")
    out = {**report, "nccl": {**report["nccl"], "build": {k: build.get(k) for k in keep}}}
    out["summary"] = report_line(out)
    return out


def report_line(report: dict) -> str:
    """One line for a person: every item with its version or ``absent``, then the registry."""
    items = ", ".join(f"{_LABELS[item]} {_shown(report.get(item))}" for item in ITEMS)
    wanted = report.get("wanted") or {}
    archs = f"{len(report.get('architectures') or [])} architectures in vLLM's registry"
    if wanted:
        archs += " (" + ", ".join(f"{a} {s}" for a, s in wanted.items()) + ")"
    return f"{items}; {archs}"


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=value lines of an env file (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for line in str(text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def roce_configured(comm_env: dict[str, str]) -> bool:
    """Whether the node's communication environment puts NCCL on the RoCE path: host_prep
    writes NCCL_IB_HCA (the twins' RoCE devices) with NCCL_IB_DISABLE=0 when the node has
    them, and NCCL_IB_DISABLE=1 alone when it has none (the simulated pair)."""
    disabled = str(comm_env.get("NCCL_IB_DISABLE", "0")).strip().lower() in ("1", "true", "yes")
    return bool(str(comm_env.get("NCCL_IB_HCA", "")).strip()) and not disabled


def refusals(report: dict, comm_env: dict[str, str] | None, node: str = "") -> list[str]:
    """Why this image cannot serve on this node, one message each; empty when it can.

    ``comm_env``: the node's comm.env (None when host_prep has not written one: nothing to
    judge against)."""
    if comm_env is None or not roce_configured(comm_env):
        return []
    if report.get("libibverbs") is not None:
        return []
    where = f"{node}: " if node else ""
    return [
        f"{where}the serving image {report.get('image') or report.get('image_id')} has no "
        f"libibverbs (no libibverbs1 package, no libibverbs.so file), but the node's comm.env "
        f"puts NCCL on the RoCE path (NCCL_IB_HCA={comm_env.get('NCCL_IB_HCA')}): NCCL would "
        "fall back to sockets at a fraction of the link's bandwidth. Install libibverbs1 and "
        "ibverbs-providers in the image (apt-get install libibverbs1 ibverbs-providers), or "
        "serve an image that has them"
    ]
