# Pure logic of the llama.cpp router module, on nixpkgs' lib: the option type of a preset, the
# presets INI, its checks, preset grids, the command line and the marker. Render a presets
# attrset to INI text with nixpkgs' lib alone (docs/nixos.md, "Rendering presets"):
#
#   nix-instantiate --eval --strict --json -E '
#     let ini = import ./modules/lib/presets-ini.nix { lib = import <nixpkgs/lib>; };
#     in ini.render { "*" = { ctx-size = 8192; }; m = { model = "/m.gguf"; min-p = 0.05; }; }'
#
# The INI dialect is the one llama-server's `--models-preset` parses (common/preset.cpp,
# "Model presets" in tools/server/README.md):
#   - a section header is `[name]`; the name may hold any character except `]` and a line
#     break, and surrounding blanks are stripped;
#   - a key matches [a-zA-Z_][a-zA-Z0-9_.-]* and is a llama-server argument without its
#     leading dashes (`ctx-size`), its short form (`c`) or its environment variable; which
#     keys a given llama-server knows is checked when the INI is built (check-preset-keys);
#   - a value runs to the end of the line, stops at the first `;` or `#` (a comment), and
#     loses leading and trailing blanks; there is no quoting or escaping;
#   - `[*]` holds global settings that every preset inherits.
# No `version = 1` line is written: recent routers skip it, but routers built from older
# llama.cpp (the llamAmpere fork's base) read a top-level key as a preset named `default`, a
# phantom model that llm-bench would then measure.
# A value the parser would silently cut or change is refused here, with the preset and the
# key in the message, instead of being rendered into a file that means something else.
{ lib }:

let
  inherit (builtins)
    attrNames
    concatMap
    concatStringsSep
    filter
    isAttrs
    isBool
    isFloat
    isInt
    isList
    isPath
    isString
    match
    toJSON
    typeOf
    ;

  float = import ./float.nix { inherit lib; };
  systemd = import ./systemd-args.nix;

  globalSection = "*";

  # The option type of one preset (services.llama-cpp.presets.<name>, llmBench.presets.<name>,
  # llmBench.engines.<engine>.presets.<name>): the values renderValue writes, null leaving the
  # key out. The type refuses lists and sets with the option's path in the message; the
  # finer checks (line breaks, comment characters, ...) are `errors`.
  presetType = lib.types.attrsOf (
    lib.types.nullOr (
      lib.types.oneOf [
        lib.types.str
        lib.types.int
        lib.types.bool
        lib.types.float
        lib.types.path
      ]
    )
  );

  # Presets a module declares, every key at mkDefault priority: a user's definition of a key
  # (null to drop it) wins over the module's without mkForce, and the rest stays.
  yielding = lib.mapAttrs (_: lib.mapAttrs (_: lib.mkDefault));

  # Names are shown as JSON strings, so a line break reads `\n` in the message.
  where =
    preset: key:
    if key == null then "preset ${toJSON preset}" else "preset ${toJSON preset}, key ${toJSON key}";

  hasLineBreak = s: match ".*[\n\r].*" s != null;

  showValue = v: if isString v then toJSON v else typeOf v;

  nameErrors =
    preset:
    let
      at = where preset null;
    in
    lib.optional (preset == "") "${at}: the name is empty"
    ++ lib.optional (hasLineBreak preset) "${at}: the name contains a line break"
    ++ lib.optional (
      match ".*].*" preset != null
    ) "${at}: the name contains `]`, which ends an INI section header"
    ++ lib.optional (
      preset != "" && match "[ \t].*|.*[ \t]" preset != null
    ) "${at}: the name starts or ends with a blank, which llama-server strips"
    # common/preset.cpp reads what follows the last `:` as a quantisation tag (owner/repo:Q8_0)
    # and lists the preset under it upper-cased, so requests for the name would find nothing.
    ++ lib.optional (
      preset != "*" && match ".*:.*" preset != null
    ) "${at}: the name holds `:`, which llama.cpp's router reads as a quantisation tag (it would list the preset under another name, and requests for this one would find nothing); use `-` instead";

  keyErrors =
    preset: key:
    lib.optional (match "[a-zA-Z_][a-zA-Z0-9_.-]*" key == null)
      "${where preset key}: the key is not a valid INI key (it must match [a-zA-Z_][a-zA-Z0-9_.-]*; write llama-server arguments without their leading dashes)";

  valueErrors =
    preset: key: value:
    let
      at = where preset key;
    in
    if value == null || isBool value || isInt value || isPath value then
      [ ]
    else if isFloat value then
      lib.optional (!(float.isFinite value)) "${at}: the float is not a finite number"
    else if isString value then
      lib.optional (hasLineBreak value) "${at}: the value contains a line break"
      ++ lib.optional (
        match ".*[;#].*" value != null
      ) "${at}: the value contains `;` or `#`, which start an INI comment; llama-server would cut the value there"
      ++ lib.optional (value == "") "${at}: the value is empty; use null to leave the key out"
      ++ lib.optional (
        value != "" && match "[ \t].*|.*[ \t]" value != null
      ) "${at}: the value starts or ends with a blank, which llama-server strips"
    else
      [
        "${at}: unsupported value type ${typeOf value} (${showValue value}); use a string, an integer, a float, a boolean, a path or null"
      ];

  sectionErrors =
    presets: preset:
    let
      section = presets.${preset};
    in
    nameErrors preset
    ++ (
      if isAttrs section then
        concatMap (key: keyErrors preset key ++ valueErrors preset key section.${key}) (attrNames section)
      else
        [ "${where preset null}: a preset must be an attribute set of keys, not a ${typeOf section}" ]
    );

  # Every problem with the preset data, as a list of messages (empty when it is fine).
  errors =
    presets:
    if !(isAttrs presets) then
      [ "presets: expected an attribute set of presets, got a ${typeOf presets}" ]
    else
      concatMap (sectionErrors presets) (attrNames presets);

  # Floats as Python's repr (lossless, ./float.nix); a path is copied to the store, so the
  # INI, and the unit that names it, depend on the file.
  renderValue =
    v:
    if isBool v then
      (if v then "true" else "false")
    else if isFloat v then
      float.toString v
    else if isPath v then
      "${v}"
    else
      toString v;

  toINI = lib.generators.toINI {
    # Names are checked above; nothing to escape.
    mkSectionName = name: name;
    mkKeyValue = lib.generators.mkKeyValueDefault { mkValueString = renderValue; } " = ";
  };

  # The INI text, `[*]` first, then the presets in attribute order; or an evaluation error
  # listing every problem.
  render =
    presets:
    let
      errs = errors presets;
      present = lib.mapAttrs (_: lib.filterAttrs (_: v: v != null)) presets;
      parts = filter (s: s != "") [
        (toINI (lib.filterAttrs (n: _: n == globalSection) present))
        (toINI (removeAttrs present [ globalSection ]))
      ];
    in
    if errs != [ ] then
      throw ("llama-cpp presets: invalid preset data:\n  " + concatStringsSep "\n  " errs)
    else
      "; llama.cpp router presets, generated by the llm-bench NixOS module; do not edit.\n"
      + concatStringsSep "" (map (part: "\n" + part) parts);

  # The names the router will list (every section but `*`).
  presetNames = presets: filter (n: n != globalSection) (attrNames presets);

  # Presets over the axes of a grid (./preset-grid.nix).
  grid = import ./preset-grid.nix;

  inherit (systemd) escapeSystemdArgs;

  # The router's flags, which services.llama-cpp passes after nixpkgs' `--host`, `--port`,
  # `-m` and `--models-dir`: the presets file, the most models loaded at once, the idle sleep.
  routerArgs =
    {
      presetsFile ? null,
      modelsMax ? null,
      sleepIdleSeconds ? null,
    }:
    lib.optionals (presetsFile != null) [
      "--models-preset"
      (systemd.argString presetsFile)
    ]
    ++ lib.optionals (modelsMax != null) [
      "--models-max"
      (toString modelsMax)
    ]
    ++ lib.optionals (sleepIdleSeconds != null) [
      "--sleep-idle-seconds"
      (toString sleepIdleSeconds)
    ];

  # The flags of a command line (its arguments that start with a dash and are not negative
  # numbers), each without a `=value` part: what check-preset-keys compares with `--help`.
  flagsOf =
    args:
    map (a: builtins.head (lib.splitString "=" a)) (
      filter (a: lib.hasPrefix "-" a && match "-[0-9.]+" a == null) args
    );

  # A source's revision when it is a full commit hash (a flake input, a fetchFromGitHub by
  # commit), else null (a tag, a path, no source).
  commitOf = rev: if isString rev && match "[0-9a-f]{40}" rev != null then rev else null;

  # The build number and commit that llama-server reports (`--version`, /props' build_info),
  # as the recipe passes them to CMake (`-DLLAMA_BUILD_NUMBER:STRING=11393`); null where the
  # build reads them from its source (NixOS 26.05's recipe takes the commit from a COMMIT file).
  buildOf =
    cmakeFlags:
    let
      valueOf =
        name:
        let
          found = lib.findFirst (f: match "-D${name}(:[A-Z]+)?=.*" f != null) null cmakeFlags;
        in
        if found == null then null else builtins.elemAt (match "-D${name}(:[A-Z]+)?=(.*)" found) 1;
      plain = v: if v != null && match "[0-9A-Za-z._-]+" v != null then v else null;
    in
    {
      buildNumber = plain (valueOf "LLAMA_BUILD_NUMBER");
      buildCommit = plain (valueOf "LLAMA_BUILD_COMMIT");
    };

  # The marker written to /etc/llama-cpp/active.json (format documented in docs/nixos.md).
  marker =
    {
      specialisation,
      packageName,
      packageVersion,
      packagePath,
      packageRev ? null,
      buildNumber ? null,
      buildCommit ? null,
      presets,
      presetsFile,
      url,
    }:
    {
      format = "llm-bench-llama-cpp-active/1";
      inherit specialisation;
      package = {
        name = packageName;
        version = packageVersion;
        path = packagePath;
        rev = packageRev;
        build_number = buildNumber;
        build_commit = buildCommit;
      };
      presets = presetNames presets;
      presets_file = presetsFile;
      inherit url;
    };
in
{
  inherit
    presetType
    yielding
    errors
    render
    renderValue
    presetNames
    grid
    escapeSystemdArgs
    routerArgs
    flagsOf
    commitOf
    buildOf
    marker
    ;
}
