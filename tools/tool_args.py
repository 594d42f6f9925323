"""What the tools/*.py command lines share: bad input is one line, "error: ...", and exit code 2."""
import argparse
import os
import sys


class ToolParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (no usage block), exit code 2."""

    def error(self, message):
        if os.environ.get("RANK", "0") == "0":  # once under torchrun (tools/generate.py)
            print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def has_text(path) -> bool:
    """Whether a file holds anything but whitespace (reads only up to the first such byte)."""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 16):
            if chunk.strip():
                return True
    return False
