"""Regenerate the bundled demo assets (deterministic): a synthetic reference picture and a control trace.

    python examples/lingbot_world_v2/assets/make_assets.py

reference.png: 416x240 (the 832x480 canvas's aspect), a sky-to-ground gradient with a sun, a road and two blocks;
no photograph, no licence question. controls.json: one entry per chunk for the default 5-chunk session.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT = 416, 240


def reference_picture() -> Image.Image:
    y = np.linspace(0.0, 1.0, HEIGHT)[:, None, None]
    sky = np.array([70, 130, 210]) * (1 - y) + np.array([200, 225, 245]) * y
    ground = np.array([90, 140, 70]) * (1.6 - y) + np.array([40, 80, 30]) * (y - 0.6)
    horizon = int(HEIGHT * 0.55)
    pixels = np.where(np.arange(HEIGHT)[:, None, None] < horizon, sky, ground)
    pixels = np.broadcast_to(pixels, (HEIGHT, WIDTH, 3)).round().clip(0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    draw.ellipse((300, 28, 348, 76), fill=(250, 220, 120))  # sun
    draw.polygon(
        [(WIDTH // 2 - 10, horizon), (WIDTH // 2 + 10, horizon), (WIDTH - 60, HEIGHT), (60, HEIGHT)],
        fill=(110, 110, 115),
    )  # road to the horizon
    draw.rectangle((40, horizon - 70, 110, horizon), fill=(180, 90, 60))  # a red block house
    draw.rectangle((290, horizon - 45, 340, horizon), fill=(230, 230, 220))
    draw.polygon([(285, horizon - 45), (345, horizon - 45), (315, horizon - 75)], fill=(150, 60, 50))
    return image


CONTROLS = [
    {"chunk": 0, "keys": ["W"]},
    {"chunk": 1, "keys": ["W", "J"]},
    {"chunk": 2, "keys": ["D"]},
    {"chunk": 3, "keys": []},
]


if __name__ == "__main__":
    reference_picture().save(HERE / "reference.png", optimize=True)
    lines = ",\n".join("  " + json.dumps(entry) for entry in CONTROLS)
    (HERE / "controls.json").write_text(f"[\n{lines}\n]\n", encoding="utf-8")
    print(f"wrote {HERE / 'reference.png'} ({(HERE / 'reference.png').stat().st_size} bytes) and controls.json")
