"""How well PP-OCR reads MiniOCR's strings rendered cleanly at 32 px: the ceiling of the task's OCR reward.

Renders `num_images` strings of the task's alphabet (lengths 2-4, styles and colours in turn), reads each with the
OCR reward's engine, and prints one JSON object: the share read exactly, the mean reward, the misreadings and the
milliseconds per image.

Usage:
    OMP_NUM_THREADS=1 python -m workers.bench.ocr_read --num-images 300 [--min-side-px 160] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time


def ocr_read_figures(num_images: int, min_side_px: int = 160, threads: int = 1, seed: int = 0) -> dict:
    import numpy as np

    from workers.task.miniocr import ALPHABET, COLORS, MAX_CHARS, MIN_CHARS, STYLES, OcrSpec, render_text
    from workers.task.rewards_ocr import OcrRewardConfig, ocr_score, read_text

    config = OcrRewardConfig(threads=threads, min_side_px=min_side_px)
    rng = np.random.default_rng(seed)
    specs = []
    for i in range(num_images):
        length = int(rng.integers(MIN_CHARS, MAX_CHARS + 1))
        text = "".join(ALPHABET[j] for j in rng.integers(len(ALPHABET), size=length))
        specs.append(OcrSpec(text, STYLES[i % len(STYLES)], list(COLORS)[i % len(COLORS)]))
    images = [render_text(spec, rng) for spec in specs]
    read_text(images[0], config)  # load the models outside the timing
    started = time.perf_counter()
    readings = [read_text(image, config) for image in images]
    per_image_ms = 1000 * (time.perf_counter() - started) / num_images
    exact = [r.replace(" ", "").lower() == s.text.lower() for r, s in zip(readings, specs, strict=True)]
    by_length = {
        n: float(np.mean([e for e, s in zip(exact, specs, strict=True) if len(s.text) == n]))
        for n in range(MIN_CHARS, MAX_CHARS + 1)
    }
    return {
        "num_images": num_images,
        "min_side_px": min_side_px,
        "threads": threads,
        "exact_share": float(np.mean(exact)),
        "exact_share_by_length": by_length,
        "mean_reward": float(np.mean([ocr_score(r, s.text) for r, s in zip(readings, specs, strict=True)])),
        "misread": [[s.text, r] for r, s, e in zip(readings, specs, exact, strict=True) if not e],
        "ms_per_image": round(per_image_ms, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=300)
    parser.add_argument("--min-side-px", type=int, default=160)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(ocr_read_figures(args.num_images, args.min_side_px, args.threads, args.seed)))


if __name__ == "__main__":
    main()
