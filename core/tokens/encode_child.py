"""The child process of `core.tokens.offload`: encodes one text with a `tokenizer.json` and exits.

stdin: the text's UTF-8 length (8 bytes, little-endian) and bytes; stdout: the id count (8 bytes) and
the ids (uint32 each). It imports only `tokenizers`, so it starts in a fraction of a second.
"""

from __future__ import annotations

import array
import struct
import sys


def main() -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(sys.argv[1])
    size = struct.unpack("<Q", sys.stdin.buffer.read(8))[0]
    text = sys.stdin.buffer.read(size).decode("utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    sys.stdout.buffer.write(struct.pack("<Q", len(ids)) + array.array("I", ids).tobytes())
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
