"""A batch split into its prompts (each without padding, with its own images) and one prompt's forward arguments."""

from __future__ import annotations

import torch


def _images_in_row(spec, images: dict, ids: torch.Tensor, image_token_id: int) -> int:
    """How many images one prompt row holds (``ids`` [P]): an entry of its image inputs each, an image's tiles one
    run of image tokens (InternVL), a real (not all-zero) sub-image each where the inputs are batched by row
    (Idefics3 / SmolVLM: their tiles and the global image)."""
    if not images:
        return 0
    if spec.image_layout == "grid":
        return int(images["image_grid_thw"].shape[0])
    if spec.image_layout == "tiles":
        return len(_runs(ids, image_token_id))
    if spec.image_layout == "rows":
        pixels = images["pixel_values"]
        return int(pixels.flatten(2).ne(0).any(-1).sum())
    return int(images["pixel_values"].shape[0])


class _Row:
    """One prompt (no padding) and its image inputs; builds the forward arguments of ``K`` copies of a sequence that
    starts with the prompt."""

    def __init__(self, model, inputs: dict, info):
        image_token_id = info.image_token_id
        self.model = model
        self.ids = inputs["input_ids"]  # [1, P]
        self.tokens = {k: inputs[k] for k in info.spec.token_inputs if inputs.get(k) is not None}  # each [1, P]
        self.images = {k: inputs[k] for k in info.spec.image_inputs if inputs.get(k) is not None}
        pos = (self.ids[0] == image_token_id).nonzero().flatten()
        if pos.numel() == 0:
            raise ValueError(f"OPERA needs image tokens (id {image_token_id}) in every prompt: its penalty reads the "
                             "attention on the image")
        # U:3432 sums image_start .. image_end inclusive (key_position, llava.py:206-210): first to last image token
        self.image_start, self.image_end = int(pos[0]), int(pos[-1])
        self.length = self.ids.shape[1]
        self.n_images = _images_in_row(info.spec, self.images, self.ids[0], image_token_id)
        self.n_image_tokens = int(pos.numel())

    def scored_prefix(self, how: str) -> int:
        if how == "embeds":
            return 1
        if how == "full":
            return self.length
        return self.length - self.n_image_tokens + self.n_images  # "llava": each image one token

    def prefill_kwargs(self, ids: torch.Tensor) -> dict:
        """Forward arguments for ``ids`` [K, L] (L >= P, the prompt first) from an empty cache."""
        k = ids.shape[0]
        kw = {"input_ids": ids}
        for key, value in self.images.items():
            kw[key] = value.repeat(k, *([1] * (value.dim() - 1)))  # each copy's images in order, as HF's expansion
        for key, value in self.tokens.items():  # the prompt's own, zeros over what follows it
            padded = torch.zeros(k, ids.shape[1], dtype=value.dtype, device=value.device)
            padded[:, : self.length] = value
            kw[key] = padded
        return kw


_PER_ROW = ("batch_num_images",)  # image inputs with one entry per prompt row (LLaVA-OneVision's images per row)


def _runs(ids: torch.Tensor, token: int) -> list[int]:
    """Lengths of the runs of ``token`` in ``ids`` [T], in order."""
    hit = (ids == token).int()
    edges = torch.diff(hit, prepend=hit.new_zeros(1), append=hit.new_zeros(1))  # +1 where a run starts, -1 after it
    return (edges.eq(-1).nonzero().flatten() - edges.eq(1).nonzero().flatten()).tolist()


def _per_image(model, spec, images: dict, runs: list[int]) -> tuple[list[int], list[int]]:
    """(image tokens, pixel_values entries) of each image of the batch, in order, as the table row's ``image_layout``
    says; ``runs`` are the prompts' runs of image tokens, row after row."""
    pixels = images["pixel_values"]
    n = pixels.shape[0]
    if spec.image_layout == "grid":  # image i has prod(grid_i) patch rows and prod(grid_i) / merge^2 tokens
        merge = getattr(model.config.vision_config, "spatial_merge_size", 2)
        patches = [int(g.prod()) for g in images["image_grid_thw"]]
        return [p // merge ** 2 for p in patches], patches
    if spec.image_layout == "per_image":  # every image gives the same number of tokens
        total = sum(runs)
        if total % n:
            raise ValueError(f"{total} image tokens do not split over {n} images")
        return [total // n] * n, [1] * n
    if spec.image_layout == "sizes":  # Pixtral: a token per (patch * merge)^2 pixels of the image's own size
        step = model.config.vision_config.patch_size * getattr(model.config, "spatial_merge_size", 1)
        return [int(h) // step * (int(w) // step) for h, w in images["image_sizes"].tolist()], [1] * n
    if spec.image_layout == "tiles":  # one run per image, the same tokens per tile
        if sum(runs) % n:
            raise ValueError(f"{sum(runs)} image tokens do not split over {n} tiles")
        per_tile = sum(runs) // n
        if any(r % per_tile for r in runs):
            raise ValueError(f"runs of image tokens {runs} are not whole tiles of {per_tile} tokens")
        return runs, [r // per_tile for r in runs]
    if spec.image_layout == "runs":  # one run per image
        if len(runs) != n:
            raise ValueError(f"{n} images given but the prompts hold {len(runs)} runs of image tokens: {spec.kind} "
                             "writes each image as one run, so OPERA splits the batch by them (images written "
                             "next to each other, with no token between, cannot be told apart)")
        return runs, [1] * n
    raise ValueError(f"OPERA cannot split {spec.kind}'s {spec.image_layout!r} image inputs by row")


def _split_rows(model, kwargs: dict, info) -> list[dict]:
    """Each row's inputs without its padding: ``input_ids`` and the per-token inputs where ``attention_mask`` is 1,
    and the row's own images, split as the table row's ``image_layout`` says: by prompt row where the inputs are
    batched so (``rows``), else consumed in order (a row holds as many images as its image tokens need)."""
    spec = info.spec
    ids = kwargs["input_ids"]
    mask = kwargs.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    rows = []
    for b in range(ids.shape[0]):
        keep = mask[b]
        row = {"input_ids": ids[b][keep][None]}
        for key in spec.token_inputs:
            if kwargs.get(key) is not None:
                row[key] = kwargs[key][b][keep][None]
        rows.append(row)
    images = {k: kwargs[k] for k in spec.image_inputs if kwargs.get(k) is not None}
    if not images or spec.image_layout == "rows":  # [B, ...] each: a row's slice is its images
        for b, row in enumerate(rows):
            row.update({k: v[b: b + 1] for k, v in images.items()})
        return rows
    row_runs = [_runs(row["input_ids"][0], info.image_token_id) for row in rows]
    per_image, patches = _per_image(model, spec, images, [r for runs in row_runs for r in runs])
    img = patch = 0
    for b, row in enumerate(rows):
        first_img, first_patch, need = img, patch, sum(row_runs[b])
        while need > 0:
            if img >= len(per_image):
                raise ValueError(f"row {b}: more image tokens than the images given")
            need -= per_image[img]
            patch += patches[img]
            img += 1
        if need != 0:
            raise ValueError(f"row {b}: its image tokens do not match whole images")
        for key, value in images.items():  # pixel rows by entry, per-row inputs by row, the rest by image
            if key in _PER_ROW:
                if int(value[b]) != img - first_img:
                    raise ValueError(f"row {b}: {key} says {int(value[b])} images, its image tokens hold "
                                     f"{img - first_img}")
                row[key] = value[b: b + 1]
            else:
                row[key] = value[first_patch:patch] if key == "pixel_values" else value[first_img:img]
    if img != len(per_image):
        raise ValueError(f"{len(per_image)} images given but the prompts hold image tokens for {img}")
    return rows
