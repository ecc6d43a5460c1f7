#!/usr/bin/env python3
"""What TensorBoard reads from a folder of events files, as JSON on stdout.

    read_events.py FOLDER

Two views, both through TensorBoard's own code (the tensorboard package from
PyPI; tests/metrics/metrics_test.cpp installs it in a venv):

  "files":   every events file in name order, record by record
             (RawEventFileLoader, which checks both CRCs of every record and
             stops quietly at the first bad one: "record_bytes" below "bytes"
             shows that it stopped early), each record parsed as an Event.
  "scalars": tag -> [[step, value], ...] as TensorBoard's UI would plot them
             (EventAccumulator over the folder: files merged in name order,
             steps dropped by a later SessionLog START purged).

Values are float32 widened to Python floats, so printing them loses nothing.
"""

import glob
import json
import os
import sys


def describe(event):
    kind = event.WhichOneof("what")
    out = {"wall_time": event.wall_time, "step": event.step, "kind": kind}
    if kind == "file_version":
        out["file_version"] = event.file_version
    elif kind == "summary":
        out["values"] = [[v.tag, v.simple_value] for v in event.summary.value]
    elif kind == "session_log":
        out["session_status"] = event.session_log.status
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_events.py FOLDER")
    folder = sys.argv[1]
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2

    files = []
    for path in sorted(glob.glob(os.path.join(folder, "*tfevents*"))):
        records = list(event_file_loader.RawEventFileLoader(path).Load())
        files.append({
            "name": os.path.basename(path),
            "bytes": os.path.getsize(path),
            # 8 length bytes, 4 CRC bytes, the payload, 4 CRC bytes.
            "record_bytes": sum(16 + len(r) for r in records),
            "events": [describe(event_pb2.Event.FromString(r)) for r in records],
        })

    accumulator = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
               for tag in accumulator.Tags()["scalars"]}
    json.dump({"files": files, "scalars": scalars}, sys.stdout)


if __name__ == "__main__":
    main()
