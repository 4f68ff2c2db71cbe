# Model sources of the preset sets (builtins only). A source is
#   - a Hugging Face repository with an optional quant tag ("owner/repo:Q4_K_M"), downloaded
#     into LLAMA_CACHE on first load from the repository's main branch (`hf-repo`);
#   - a Hugging Face file pinned to a revision, { repo = "owner/repo"; file = "x.gguf";
#     revision = "<commit>"; }, downloaded from that revision's URL (`model-url`), so a later
#     push to the repository changes nothing that is measured;
#   - a GGUF file: an absolute path string, or a path value, which the renderer copies to the
#     store.
let
  inherit (builtins) isAttrs isPath match;
in
rec {
  isPinned = isAttrs;

  isLocalSource = source: !(isPinned source) && (isPath source || match "/.*" source != null);

  pinnedUrl = source: "https://huggingface.co/${source.repo}/resolve/${source.revision}/${source.file}";

  modelSource =
    source:
    if isPinned source then
      { model-url = pinnedUrl source; }
    else if isLocalSource source then
      { model = source; }
    else
      { hf-repo = source; };

  draftSource =
    source:
    if isPinned source then
      throw "llm-bench presets: the draft model ${source.repo}/${source.file} cannot be pinned to a revision: llama-server has no URL option for a draft model; download that file and give its path instead"
    else if isLocalSource source then
      { spec-draft-model = source; }
    else
      { spec-draft-hf = source; };
}
