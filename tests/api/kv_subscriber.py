"""A KV-event subscriber written from the wire format alone (vLLM's, as llm-d reads it): its own
msgspec structs, a SUB socket for the live stream and a DEALER for replays. Not the server's
code: the tests check the server against it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec
import zmq


class Stored(msgspec.Struct, tag_field="type", tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class Removed(msgspec.Struct, tag_field="type", tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class Cleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared"):
    pass


class Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Stored | Removed | Cleared]
    data_parallel_rank: int | None


# vLLM's older positional form: the tag first, then the fields in order.
class StoredArray(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class RemovedArray(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class ClearedArray(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[StoredArray | RemovedArray | ClearedArray]
    data_parallel_rank: int | None


END = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class Message:
    topic: bytes
    seq: int
    batch: Batch | ArrayBatch


def decode(topic: bytes, seq: bytes, payload: bytes, *, arrays: bool = False) -> Message:
    assert len(seq) == 8
    batch: Batch | ArrayBatch = (
        msgspec.msgpack.decode(payload, type=ArrayBatch)
        if arrays
        else msgspec.msgpack.decode(payload, type=Batch)
    )
    return Message(topic, int.from_bytes(seq, "big"), batch)


def held(messages: list[Message]) -> frozenset[int]:
    """The block set the stream describes, in sequence order."""
    keys: set[int] = set()
    for message in sorted(messages, key=lambda m: m.seq):
        for event in message.batch.events:
            if isinstance(event, Stored | StoredArray):
                assert len(event.token_ids) == event.block_size * len(event.block_hashes)
                keys.update(event.block_hashes)
            elif isinstance(event, Removed | RemovedArray):
                keys.difference_update(event.block_hashes)
            else:
                keys.clear()
    return frozenset(keys)


def replay(
    endpoint: str, start: int, *, arrays: bool = False, timeout_s: float = 10.0
) -> list[Message]:
    """Ask the replay socket for every kept message from `start`, until the end marker."""
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart((b"", start.to_bytes(8, "big")))
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while True:
            assert dealer.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "no replay"
            frames = dealer.recv_multipart()
            assert frames[0] == b"" and len(frames) == 4, frames
            _, topic, seq, payload = frames
            if seq == END:
                assert topic == b"" and payload == b""
                return out
            out.append(decode(topic, seq, payload, arrays=arrays))
    finally:
        dealer.close()


def subscribe(endpoint: str, topic: bytes = b"") -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    return sub


def drain(
    sub: zmq.Socket, *, until_seq: int, arrays: bool = False, timeout_s: float = 10.0
) -> list[Message]:
    """Live messages until the one numbered until_seq has arrived."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not out or out[-1].seq < until_seq:
        assert sub.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "the stream stopped"
        out.append(decode(*sub.recv_multipart(), arrays=arrays))
    return out
