"""Generates the protobuf and gRPC Python modules of every .proto in the package.

Used by the wheel build (setup.py), by Bazel (a genrule) and by developers
(``python tools/gen_protos.py --out .`` writes them next to the sources).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

PROTO_DIR = os.path.join("tensorflow_elastic", "proto")


def proto_files(source_root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(source_root, PROTO_DIR, "*.proto")))


def generate(source_root: str, out_root: str, protos: list[str] | None = None) -> list[str]:
    """Runs protoc for the given protos (default: all); returns the generated file paths."""
    from grpc_tools import protoc
    import grpc_tools

    protos = proto_files(source_root) if protos is None else [
        os.path.join(source_root, p) for p in protos]
    if not protos:
        return []
    os.makedirs(os.path.join(out_root, PROTO_DIR), exist_ok=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    relative = [os.path.relpath(p, source_root) for p in protos]
    args = ["grpc_tools.protoc", f"-I{source_root}", f"-I{well_known}",
            f"--python_out={out_root}", f"--grpc_python_out={out_root}", *relative]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {relative}")
    outputs = []
    for rel in relative:
        stem = rel[: -len(".proto")]
        outputs += [os.path.join(out_root, stem + "_pb2.py"),
                    os.path.join(out_root, stem + "_pb2_grpc.py")]
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source_root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="repository root holding tensorflow_elastic/")
    parser.add_argument("--out", required=True, help="root directory to write the modules under")
    parser.add_argument("protos", nargs="*", help="proto files relative to --source_root (default: all)")
    args = parser.parse_args(argv)
    for path in generate(args.source_root, args.out, args.protos or None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
