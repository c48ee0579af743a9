#!/usr/bin/env python3
"""A RustStream producer in Python (redis-py): pushes framed messages, each with an id and
headers, to a list (a work queue) or a stream that a Rust subscriber reads.

The frame is the one `ruststream_redis::frame` defines (docs/guide, "Wire format"):

    MAGIC b"\\0rs1" | attempt u32 | id_len u16 | id | n u16 | n x (key_len u16 | key | len u32 | value) | payload

all integers big-endian, text UTF-8. A stream entry carries the same parts as fields instead:
`payload`, `rs.id`, then one field per header.

    python3 producer.py --url redis://127.0.0.1:6379 --key '{thumbnails}' \\
        --id job-1 --header tenant=acme '{"image": "a.png"}'
"""

import argparse
import json
import struct
import sys
import uuid

import redis

MAGIC = b"\0rs1"


def frame(message_id, headers, payload, attempt=1):
    """The bytes of one list entry (or Pub/Sub message): headers sorted by key, as the Rust
    encoder writes them, so two encodings of one message are equal byte for byte."""
    out = bytearray(MAGIC)
    out += struct.pack(">I", attempt)
    raw_id = message_id.encode()
    out += struct.pack(">H", len(raw_id)) + raw_id
    out += struct.pack(">H", len(headers))
    for key in sorted(headers):
        k, v = key.encode(), headers[key].encode()
        out += struct.pack(">H", len(k)) + k + struct.pack(">I", len(v)) + v
    out += payload
    return bytes(out)


def push(client, key, message, message_id=None, headers=None):
    """LPUSHes `message` (serialised as JSON, the subscribers' default codec) to the list `key`;
    returns the message id (a new UUID when none is given)."""
    message_id = message_id or str(uuid.uuid4())
    payload = json.dumps(message, separators=(",", ":")).encode()
    client.lpush(key, frame(message_id, headers or {}, payload))
    return message_id


def add(client, key, message, message_id=None, headers=None):
    """XADDs `message` to the stream `key`: the `payload` field, the id in `rs.id`, and every
    header as a field of its own; returns the message id."""
    message_id = message_id or str(uuid.uuid4())
    fields = {"payload": json.dumps(message, separators=(",", ":")), "rs.id": message_id}
    fields.update(headers or {})
    client.xadd(key, fields)
    return message_id


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379")
    parser.add_argument("--key", required=True, help="the list (or stream, with --stream)")
    parser.add_argument("--stream", action="store_true", help="XADD to a stream, not LPUSH")
    parser.add_argument("--id", help="the message id (default: a new UUID)")
    parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("message", help="the message, as JSON")
    args = parser.parse_args()
    headers = dict(h.split("=", 1) for h in args.header)
    client = redis.Redis.from_url(args.url)
    send = add if args.stream else push
    print(send(client, args.key, json.loads(args.message), args.id, headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
