// specwatch monitoring mixin: Prometheus recording rules, alerts and Grafana dashboards for vLLM
// speculative decoding (standard and FLy) and the specwatch sidecar.
//
//   local specwatch = (import 'specwatch/deploy/mixin/mixin.libsonnet') + {
//     _config+:: { vllmSelector: 'job="vllm"', runbookURLPattern: 'https://runbooks.example/%s' },
//   };
//   { 'rules.yaml': std.manifestYamlDoc(specwatch.prometheusRules),
//     'alerts.yaml': std.manifestYamlDoc(specwatch.prometheusAlerts) }
//
// Fields:
//   _config              config.libsonnet (selectors, cluster label, runbook URL pattern, rules-only
//                        knobs) merged with thresholds.libsonnet (generated from the detectors'
//                        Python defaults; do not edit).
//   prometheusRules      {groups: [...]}: the recording rule groups.
//   prometheusAlerts     {groups: [...]}: the alerting rule groups, every alert with a runbook_url.
//   grafanaDashboards    file name -> dashboard JSON (the dashboards of the repository's grafana/).
//
// The rule texts live once, in rules/<area>.yaml.tmpl: YAML with %(name)s placeholders filled
// from _config (a string or number key). Grafana reads the dashboards from ../../grafana, so
// vendor the whole repository with jsonnet-bundler (see README.md), not only this directory.
local areas = [
  importstr 'rules/spec_decode.yaml.tmpl',
  importstr 'rules/fly.yaml.tmpl',
  importstr 'rules/quality.yaml.tmpl',
  importstr 'rules/self.yaml.tmpl',
];

// template text with every %(key)s of a string or number _config key replaced by its value,
// then the matchers an empty selector leaves behind removed: x{a="1", } -> x{a="1"}, x{} -> x.
local fill(text, config) =
  local keys = [k for k in std.objectFields(config) if std.isString(config[k]) || std.isNumber(config[k])];
  local filled = std.foldl(
    function(acc, k) std.strReplace(acc, '%(' + k + ')s', if std.isNumber(config[k]) then '%g' % config[k] else config[k]), keys, text
  );
  local cleaned = std.strReplace(std.strReplace(std.strReplace(filled, ', }', '}'), ',}', '}'), '{}', '');
  local left = std.findSubstr('%(', cleaned);
  assert std.length(left) == 0 :
         'unknown placeholder in a rule template: ' + cleaned[left[0]:left[0] + 40];
  cleaned;

local isAlertGroup(group) = std.length([r for r in group.rules if std.objectHas(r, 'alert')]) > 0;

local withRunbook(rule, pattern) =
  if std.objectHas(rule, 'alert') then
    assert !std.objectHas(std.get(rule, 'annotations', {}), 'runbook_url') :
           rule.alert + ': runbook_url comes from runbookURLPattern';
    rule { annotations+: { runbook_url: pattern % std.asciiLower(rule.alert) } }
  else rule;

{
  _config+:: (import 'config.libsonnet') + (import 'thresholds.libsonnet'),

  local groups = std.flattenArrays([std.parseYaml(fill(area, $._config)).groups for area in areas]),
  local pure = [
    assert !isAlertGroup(g) || std.length([r for r in g.rules if std.objectHas(r, 'record')]) == 0 :
           g.name + ': mixes recording and alerting rules';
    g
    for g in groups
  ],

  prometheusRules+:: {
    groups+: [g for g in pure if !isAlertGroup(g)],
  },

  prometheusAlerts+:: {
    groups+: [
      g { rules: [withRunbook(r, $._config.runbookURLPattern) for r in g.rules] }
      for g in pure
      if isAlertGroup(g)
    ],
  },

  grafanaDashboards+:: {
    'specwatch-alerts.json': import '../../grafana/specwatch-alerts.json',
    'specwatch-capacity.json': import '../../grafana/specwatch-capacity.json',
    'specwatch-overview.json': import '../../grafana/specwatch-overview.json',
    'specwatch-quality.json': import '../../grafana/specwatch-quality.json',
  },
}
