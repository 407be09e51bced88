"""Model architectures: the one architecture table, the loader of every supported checkpoint directory, the
LLaDA masked-diffusion classes with their checkpoint key map, and the explicit Auto-class registration."""

from .arch import (
    ARCHITECTURES,
    AUTOREGRESSIVE,
    DIFFUSION,
    ArchInfo,
    ArchSpec,
    arch_info,
    arch_spec,
    check_layers,
    decoder_stack,
    image_token_id,
    kind_of,
)
from .checkpoint import (
    DTYPE_CHOICES,
    checkpoint_kind,
    load_checkpoint,
    load_processor,
    read_config,
    resolve_device,
    resolve_dtype,
)
from .llada import (
    CHECKPOINT_KEY_MAP,
    LladaConfig,
    LladaForMaskedDiffusion,
    LladaModel,
    llada_config_from_olmo,
    load_llada_v,
    load_mapped_state,
    map_checkpoint_keys,
)
from .processors import QwenImageProcessor
from .registry import register_model_types

__all__ = [
    "ARCHITECTURES", "AUTOREGRESSIVE", "CHECKPOINT_KEY_MAP", "DIFFUSION", "DTYPE_CHOICES", "ArchInfo", "ArchSpec",
    "LladaConfig", "LladaForMaskedDiffusion", "LladaModel", "QwenImageProcessor", "arch_info", "arch_spec",
    "check_layers", "checkpoint_kind", "decoder_stack", "image_token_id", "kind_of", "llada_config_from_olmo",
    "load_checkpoint", "load_llada_v", "load_mapped_state", "load_processor", "map_checkpoint_keys", "read_config",
    "register_model_types", "resolve_device", "resolve_dtype",
]
