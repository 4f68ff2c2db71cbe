# Floats written without loss, exactly as Python's repr() writes them: the shortest decimal
# that reads back as the same double ("0.7", "5e-07", "123456789.125", "1e+20", "3.0").
#
# Nix has no such builtin: toString writes six decimals (0.0000005 -> "0.000000") and Nix 2.8's
# toJSON six significant digits (123456789.125 -> "1.23457e+08"); newer Nix's toJSON is exact,
# but a module cannot choose the Nix that evaluates it. So the digits are found by trial: for
# p = 1, 2, ... 17 significant digits, the integers nearest |v| * 10^(p-1-e) are read back
# with builtins.fromJSON (strtod, correctly rounded) and the first that equals v wins; 17
# digits always round-trip a double. Python's repr is the reference because llm-bench, which
# writes preset snippets for this module, is Python: the INI then holds what it printed.
{ lib }:

let
  inherit (builtins) fromJSON floor stringLength substring;

  # 10^e as the nearest double (the parser rounds correctly; 1e-324 and below read as 0).
  pow10 = e: fromJSON "1e${toString e}";

  scaleBy10 =
    a: s:
    if s > 300 then
      a * pow10 300 * pow10 (s - 300)
    else if s >= 0 then
      a * pow10 s
    else
      a / pow10 (-s);

  # The largest e with 10^e <= a (a > 0). Off by one near a power of ten does no harm: the
  # digit count of the accepted integer fixes the decimal point, not e.
  exponentOf =
    a:
    let
      go =
        lo: hi:
        if hi - lo <= 1 then
          (if pow10 hi <= a then hi else lo)
        else
          let
            mid = (lo + hi) / 2;
          in
          if pow10 mid <= a then go mid hi else go lo mid;
    in
    go (-324) 308;

  abs = x: if x < 0 then -x else x;

  zeros = n: lib.concatStrings (lib.genList (_: "0") n);

  # { n, s } with n * 10^-s == a and n of p digits, or null when no p-digit decimal reads back
  # as a. x carries the rounding of the scaling (a few units of its last place, so up to
  # ~35 at 17 digits), and at 16 and 17 digits several neighbours can read back as a; the
  # candidates span both. The ones that read back are the integers inside a's rounding
  # interval, centred on a, so the middle one is the nearest to a (Python picks the nearest;
  # when the interval holds an even number of them the lower middle is taken, which can
  # differ from Python in the 17th digit, never in what reads back).
  digitsAt =
    a: e: p:
    let
      s = p - 1 - e;
      x = scaleBy10 a s;
      n0 = floor x;
      # Below the normal range a double's spacing is fixed (4.9e-324) and may span many
      # candidates.
      spacing = if a < fromJSON "2.2250738585072014e-308" then scaleBy10 (fromJSON "5e-324") s else 0.0;
      width = floor (if spacing > x * 6.5e-16 then spacing else x * 6.5e-16) + 2;
      # fromJSON fails on a decimal beyond the largest double instead of reading infinity,
      # so such a candidate is never read.
      parsable =
        n:
        let
          str = toString n;
          len = stringLength str;
          decpt = len - s;
        in
        decpt < 309 || (decpt == 309 && len <= 17 && substring 0 17 (str + zeros 17) <= "17976931348623158");
      readsBack = n: n > 0 && parsable n && fromJSON "${toString n}e${toString (-s)}" == a;
      hits = lib.filter readsBack (lib.genList (i: n0 - width + i) (2 * width + 1));
      count = lib.length hits;
    in
    if hits == [ ] then null else { n = lib.elemAt hits ((count - 1) / 2); inherit s; };

  shortestDigits =
    a:
    let
      e = exponentOf a;
      go =
        p:
        let
          found = digitsAt a e p;
        in
        if found != null then
          found
        else if p >= 17 then
          throw "float.nix: no decimal of 17 digits reads back as ${builtins.toJSON a}"
        else
          go (p + 1);
    in
    go 1;

  stripTrailingZeros =
    ds:
    let
      len = stringLength ds;
    in
    if len > 1 && substring (len - 1) 1 ds == "0" then stripTrailingZeros (substring 0 (len - 1) ds) else ds;

  # Python's float_repr_style "short": plain notation while the decimal point lies within
  # 16 places, else d.ddde+XX with at least two exponent digits.
  format =
    a:
    let
      found = shortestDigits a;
      raw = toString found.n;
      ds = stripTrailingZeros raw;
      len = stringLength ds;
      decpt = stringLength raw - found.s;
      exp = decpt - 1;
      expDigits = toString (abs exp);
    in
    if decpt <= -4 || decpt > 16 then
      substring 0 1 ds
      + (if len > 1 then "." + substring 1 (len - 1) ds else "")
      + "e"
      + (if exp < 0 then "-" else "+")
      + (if stringLength expDigits < 2 then "0" else "")
      + expDigits
    else if decpt <= 0 then
      "0." + zeros (-decpt) + ds
    else if decpt >= len then
      ds + zeros (decpt - len) + ".0"
    else
      substring 0 decpt ds + "." + substring decpt (len - decpt) ds;

  # Infinity and NaN have no INI spelling llama-server reads back; inf - inf is NaN, and NaN
  # equals nothing.
  isFinite = v: v - v == 0.0;
in
{
  inherit isFinite;

  toString =
    v:
    if !(isFinite v) then
      throw "float.nix: ${builtins.toJSON v} is not a finite number"
    else if v == 0.0 then
      "0.0"
    else if v < 0 then
      "-" + format (-v)
    else
      format v;
}
