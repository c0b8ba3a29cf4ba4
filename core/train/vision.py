"""A sample's images back from the store, for a vision-language trainer: the pixels the tokens were sampled with.

A sample's last merged call carries the whole branch in its request (each call extends the one
before), so its images, in prompt order, are the ones whose placeholder runs are in the sample's
tokens; the request names them by blob reference, and `blobs` holds their bytes once.
"""

from __future__ import annotations

from typing import Any

from core.chat import ImagePart, request_images
from core.errors import TrainingDataError
from core.rollout.recorded import request_chat
from core.store.bodies import request_of
from core.train.types import Sample


def sample_images(cursor: Any, sample: Sample) -> list[ImagePart]:
    """The images of `sample` in prompt order, with their bytes from `blobs` (TrainingDataError if one is missing)."""
    if not sample.call_ids:
        return []
    row = cursor.execute("SELECT api, model FROM calls WHERE call_id = ?", [sample.call_ids[-1]]).fetchone()
    if row is None:
        raise TrainingDataError(f"sample {sample.sample_id}: its last call {sample.call_ids[-1]} is not in the store")
    messages, _ = request_chat(row[0], request_of(cursor, sample.call_ids[-1]), row[1], exported=False)
    refs = request_images(messages)
    if not refs:
        return []
    wanted = sorted({image.sha256 for image in refs})
    found = dict(
        (sha, (media_type, bytes(data)))
        for sha, media_type, data in cursor.execute("SELECT sha256, media_type, data FROM blobs WHERE list_contains(?, sha256)", [wanted]).fetchall()
    )
    missing = [sha for sha in wanted if sha not in found]
    if missing:
        raise TrainingDataError(f"sample {sample.sample_id}: image(s) {', '.join(s[:12] for s in missing)} are not in the store's blobs")
    return [ImagePart(image.sha256, found[image.sha256][0], found[image.sha256][1]) for image in refs]
