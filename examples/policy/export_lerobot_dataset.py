"""Export a LeRobot dataset to dtrain's recorded-episodes file (episodes.safetensors).

Run once, with LeRobot installed (it reads the dataset; dtrain then trains
from the one file it writes, without Python):

    python export_lerobot_dataset.py lerobot/aloha_sim_insertion_human episodes.safetensors
    python export_lerobot_dataset.py local/my_robot out.safetensors --root ~/data/my_robot \
        --episodes 0,1,2 --cameras observation.images.top

REPO_ID_OR_LOCAL_DIR is a Hugging Face dataset id (downloaded into LeRobot's
cache unless --root names a folder that holds it) or a local dataset folder
(then the folder is the root and its name the id). The dataset is opened
with LeRobot's own LeRobotDataset, so videos are decoded as LeRobot training
would decode them, and every frame of the chosen episodes is written, in
episode order, to one safetensors file:

    observation.images.<camera>  uint8 [N, 3, H, W]  RGB, 0..255 (LeRobot's float
                                 [0, 1] frames x 255, rounded); one per camera
    observation.state            float32 [N, S]
    action                       float32 [N, A]
    episode_index                int64 [N]  non-decreasing; an episode's frames are
                                 contiguous and in time order
    metadata: format = "dtrain-episodes/1", fps = the dataset's frames per
              second, cameras = the camera keys, comma-separated, in order

N is the number of frames in all. The action chunks are not stored: a trainer
takes actions[t .. t+C-1] of the frame's episode and pads past its end by
repeating the last action (flagged action_is_pad, as LeRobot does). Every
camera must have the same image size (choose cameras with --cameras
otherwise). Memory: the whole export is held in RAM before it is written.
"""

import argparse
import os
import sys

import torch
from safetensors.torch import save_file

from lerobot.datasets.lerobot_dataset import LeRobotDataset

STATE, ACTION = "observation.state", "action"


def fail(message):
    sys.exit(f"export_lerobot_dataset: {message}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset", metavar="REPO_ID_OR_LOCAL_DIR")
    p.add_argument("out", metavar="OUT.safetensors")
    p.add_argument("--root", help="folder that holds the dataset (default: LeRobot's cache, or the local dir)")
    p.add_argument("--episodes", help="comma-separated episode indices (default: all)")
    p.add_argument("--cameras", help="comma-separated camera keys, in order (default: all the dataset's cameras)")
    args = p.parse_args()

    repo_id, root = args.dataset, args.root
    if root is None and os.path.isdir(args.dataset):
        root, repo_id = args.dataset, "local/" + os.path.basename(os.path.normpath(args.dataset))
    episodes = [int(e) for e in args.episodes.split(",")] if args.episodes else None
    dataset = LeRobotDataset(repo_id, root=root, episodes=episodes)

    for key in (STATE, ACTION):
        if key not in dataset.features:
            fail(f"the dataset has no '{key}' feature (it has: {', '.join(dataset.features)})")
    cameras = args.cameras.split(",") if args.cameras else list(dataset.meta.camera_keys)
    if not cameras:
        fail("the dataset has no cameras")
    for cam in cameras:
        if cam not in dataset.meta.camera_keys:
            fail(f"'{cam}' is not a camera of the dataset (its cameras: {', '.join(dataset.meta.camera_keys)})")

    columns = {key: [] for key in (*cameras, STATE, ACTION, "episode_index", "frame_index")}
    for i in range(len(dataset)):
        item = dataset[i]
        for cam in cameras:
            image = item[cam]
            if image.ndim != 3 or image.shape[0] != 3:
                fail(f"'{cam}' frame {i} has shape {list(image.shape)}, not [3, H, W]")
            columns[cam].append((image.float().clamp(0, 1) * 255).round().to(torch.uint8))
        for key in (STATE, ACTION, "episode_index", "frame_index"):
            columns[key].append(item[key])
        if (i + 1) % 1000 == 0:
            print(f"{i + 1}/{len(dataset)} frames", file=sys.stderr)

    sizes = {cam: tuple(columns[cam][0].shape[1:]) for cam in cameras}
    if len(set(sizes.values())) > 1:
        fail("the cameras differ in size (" + ", ".join(f"{c}: {h}x{w}" for c, (h, w) in sizes.items())
             + "); export cameras of one size with --cameras")
    episode = torch.stack([torch.as_tensor(e).reshape(()) for e in columns["episode_index"]]).long()
    frame = torch.stack([torch.as_tensor(f).reshape(()) for f in columns["frame_index"]]).long()
    order = torch.argsort(episode * (int(frame.max()) + 1) + frame, stable=True)  # episode order, time order
    tensors = {cam: torch.stack(columns[cam])[order].contiguous() for cam in cameras}
    for key in (STATE, ACTION):
        values = torch.stack([torch.as_tensor(v) for v in columns[key]]).float()
        if values.ndim != 2:
            fail(f"'{key}' has shape {list(values.shape[1:])} per frame, not a vector")
        tensors[key] = values[order].contiguous()
    tensors["episode_index"] = episode[order].contiguous()
    save_file(tensors, args.out, metadata={"format": "dtrain-episodes/1", "fps": str(dataset.fps),
                                           "cameras": ",".join(cameras)})
    h, w = sizes[cameras[0]]
    print(f"wrote {args.out}: {len(order)} frames, {len(torch.unique(episode))} episode(s), {len(cameras)} "
          f"camera(s) at {h}x{w}, state {tensors[STATE].shape[1]}, action {tensors[ACTION].shape[1]}, "
          f"{dataset.fps} fps")


if __name__ == "__main__":
    main()
