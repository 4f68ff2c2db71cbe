# Model sources of the preset sets (builtins only). A source is a Hugging Face repository with
# an optional quant tag ("owner/repo:Q4_K_M", downloaded into LLAMA_CACHE on first load) or a
# GGUF file: an absolute path string, or a path value, which the renderer copies to the store.
let
  inherit (builtins) isPath match;
in
rec {
  isLocalSource = source: isPath source || match "/.*" source != null;

  modelSource = source: if isLocalSource source then { model = source; } else { hf-repo = source; };

  draftSource =
    source: if isLocalSource source then { spec-draft-model = source; } else { spec-draft-hf = source; };
}
