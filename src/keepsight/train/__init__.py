"""Training of the methods: PVM stage-1 SFT (stage-2 GRPO, bridge phases and diffusion training to come)."""
