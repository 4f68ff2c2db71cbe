# A grid of presets (builtins only, so preset data files can use it without nixpkgs): every
# combination of one entry per axis, over `base`. `axes` is a list (its order is the order of
# the name's parts) of attribute sets from a label to the settings that label adds; a preset is
# named `prefix-label1-label2...`, an empty label adding no part (for an axis with a "nothing
# extra" entry). Later axes override earlier ones and `base` on the same key.
#
#   grid { prefix = "ampere"; base = { model = "/m.gguf"; };
#          axes = [ { turbo3 = { cache-type-k = "turbo3"; }; turbo4 = { ... }; }
#                   { d1 = { spec-draft-n-max = 1; }; d3 = { spec-draft-n-max = 3; }; } ]; }
#   => { ampere-turbo3-d1 = ...; ampere-turbo3-d3 = ...; ampere-turbo4-d1 = ...; ... }
{
  prefix,
  base ? { },
  axes,
}:
let
  inherit (builtins)
    attrNames
    concatMap
    concatStringsSep
    foldl'
    listToAttrs
    ;

  extend =
    combos: axis:
    concatMap (
      combo:
      map (label: {
        labels = combo.labels ++ (if label == "" then [ ] else [ label ]);
        settings = combo.settings // axis.${label};
      }) (attrNames axis)
    ) combos;

  combos = foldl' extend [
    {
      labels = [ ];
      settings = base;
    }
  ] axes;
in
listToAttrs (
  map (combo: {
    name = concatStringsSep "-" ([ prefix ] ++ combo.labels);
    value = combo.settings;
  }) combos
)
