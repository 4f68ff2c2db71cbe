# The `[*]` section shared by every preset set (builtins-only data).
{
  ctx-size = 65536;
  fit = "on";
  flash-attn = "on";
  cache-type-k = "q8_0";
  cache-type-v = "q8_0";
  # Text only: do not fetch or load the multimodal projector that `hf-repo` would bring.
  no-mmproj = true;
}
