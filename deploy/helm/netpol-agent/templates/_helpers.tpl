{{/*
The image tag: the value, else "v" and the chart's appVersion (the release).
*/}}
{{- define "netpol-agent.tag" -}}
{{- .Values.image.tag | default (printf "v%s" .Chart.AppVersion) -}}
{{- end -}}

{{/*
Merges list `patch` into list `base` by the field `key`, as kustomize's strategic merge does
for the named lists of a pod (env by name, volumeMounts by mountPath, volumes by name): an
item of `patch` takes the place of `base`'s item with the same key, its fields over the old
ones; the others are appended in order. Called with (list base patch key); returns JSON.
*/}}
{{- define "netpol-agent.mergeByKey" -}}
{{- $base := index . 0 | default list -}}
{{- $patch := index . 1 | default list -}}
{{- $key := index . 2 -}}
{{- $out := list -}}
{{- range $b := $base -}}
  {{- $m := $b -}}
  {{- range $p := $patch -}}
    {{- if eq (get $p $key) (get $b $key) -}}
      {{- $m = merge (deepCopy $p) $b -}}
    {{- end -}}
  {{- end -}}
  {{- $out = append $out $m -}}
{{- end -}}
{{- range $p := $patch -}}
  {{- $found := false -}}
  {{- range $b := $base -}}
    {{- if eq (get $p $key) (get $b $key) -}}{{- $found = true -}}{{- end -}}
  {{- end -}}
  {{- if not $found -}}{{- $out = append $out $p -}}{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
One of deploy/'s manifests (through files/), in the release's namespace when it has one.
*/}}
{{- define "netpol-agent.manifest" -}}
{{- $obj := .root.Files.Get .file | fromYaml -}}
{{- if hasKey $obj.metadata "namespace" -}}
{{- $_ := set $obj.metadata "namespace" .root.Release.Namespace -}}
{{- end -}}
{{- toJson $obj -}}
{{- end -}}
