"""Training of the methods: PVM stage 1 (SFT) and stage 2 (GRPO), the LoRA control, the bridge phases, and
masked-diffusion training of the world's LLaDA-V-style model."""
