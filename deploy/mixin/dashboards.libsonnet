// The dashboards of ../../grafana with the mixin's _config applied: `configure(dashboard, config)`.
//
// The checked-in JSON is what Grafana loads without jsonnet; it is written for the default
// _config (empty selectors, clusterLabel 'cluster'), for which `configure` returns it unchanged.
// Every series selector of a panel query or a variable query starts with the cluster matcher
// `{cluster=~"$cluster"` (tests/deploy/test_dashboards.py keeps it so), and the first variable
// lists clusters with `label_values(specwatch_build_info, cluster)` (the whole query). `configure`
// rewrites those:
//
// - the cluster matcher and the cluster variable's label become config.clusterLabel;
// - the selector of the series' engine is put in front of the matcher: specwatchSelector for
//   specwatch_* series, vllmSelector for vllm:*, sglangSelector for sglang:*; Prometheus' own
//   ALERTS series get none.
//
// Only strings under the keys `expr`, `query` and `definition` are rewritten; titles,
// descriptions and variable names stay as they are.
local strings = import 'strings.libsonnet';
local idChars = {
  [c]: true
  for c in std.stringChars('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:')
};
local clusterMatcher = '{cluster=~"$cluster"';
local clusterList = 'label_values(specwatch_build_info, cluster)';

// the metric name that ends `text` (the characters of a name before a `{`), '' when none
local trailingName(text) =
  local n = std.length(text);
  local start(i) = if i > 0 && std.objectHas(idChars, text[i - 1]) then start(i - 1) else i;
  local s = start(n);
  std.substr(text, s, n - s);

local selectorFor(name, config) =
  if std.startsWith(name, 'specwatch_') then config.specwatchSelector
  else if std.startsWith(name, 'vllm:') then config.vllmSelector
  else if std.startsWith(name, 'sglang:') then config.sglangSelector
  else '';

local withSelector(selector, rest) = if selector == '' then rest else selector + ', ' + rest;

local configureText(text, config) =
  if text == clusterList then
    'label_values(specwatch_build_info%s, %s)' % [
      if config.specwatchSelector == '' then '' else '{' + config.specwatchSelector + '}',
      config.clusterLabel,
    ]
  else
    // split, not std.findSubstr alone: the jsonnet wheel's findSubstr takes ~0.1 s per query
    local pieces = strings.split(text, clusterMatcher);
    pieces[0] + std.join('', [
      '{' + withSelector(
        selectorFor(trailingName(pieces[i - 1]), config),
        config.clusterLabel + '=~"$cluster"',
      ) + pieces[i]
      for i in std.range(1, std.length(pieces) - 1)
    ]);

local rewritten = ['expr', 'query', 'definition'];

local walk(value, config) =
  if std.isObject(value) then {
    [k]: if std.isString(value[k]) && std.member(rewritten, k) then configureText(value[k], config)
    else walk(value[k], config)
    for k in std.objectFields(value)
  }
  else if std.isArray(value) then [walk(v, config) for v in value]
  else value;

{
  configure(dashboard, config):: walk(dashboard, config),

  files:: {
    'specwatch-alerts.json': import '../../grafana/specwatch-alerts.json',
    'specwatch-capacity.json': import '../../grafana/specwatch-capacity.json',
    'specwatch-overview.json': import '../../grafana/specwatch-overview.json',
    'specwatch-quality.json': import '../../grafana/specwatch-quality.json',
  },
}
