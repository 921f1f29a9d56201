{{/* Names: <fullname>-<part>, fullname "ipamgc" by default (deploy/'s names). */}}
{{- define "ipamgc.fullname" -}}
{{- default "ipamgc" .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "ipamgc.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* Labels of every object; `component` in the dict. */}}
{{- define "ipamgc.labels" -}}
app.kubernetes.io/name: ipamgc
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The selector of a component's pods (what deploy/ selects by). */}}
{{- define "ipamgc.selector" -}}
app.kubernetes.io/name: ipamgc
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ipamgc.components" -}}watcher worker leader reader{{- end -}}

{{/*
The Redis URL values, checked: ipamgc refuses deploy/'s placeholder passwords (`change-me…`) at start
(shared/acl.py), so the chart refuses to render them.
*/}}
{{- define "ipamgc.placeholder" -}}
{{- if regexMatch "(?i)(^[a-z]+://[^/@?]*:change-me[^@]*@)|([?&]password=change-me)" . -}}yes{{- end -}}
{{- end -}}

{{/* The Secret a component reads its Redis URL from (key `url`), or "" when it has none. */}}
{{- define "ipamgc.redisSecret" -}}
{{- $v := .root.Values.redis -}}
{{- $existing := index $v.existingSecrets .component -}}
{{- if $existing -}}
{{ $existing }}
{{- else if or $v.bundled (index $v.external.urls .component) -}}
{{ include "ipamgc.fullname" .root }}-redis-{{ .component }}
{{- end -}}
{{- end -}}

{{/* The URL the chart writes into a component's Secret (after the checks of redis-secrets.yaml). */}}
{{- define "ipamgc.redisURL" -}}
{{- $v := .root.Values.redis -}}
{{- if $v.bundled -}}
redis://{{ .component }}:{{ index $v.passwords .component }}@{{ include "ipamgc.fullname" .root }}-redis:6379/0
{{- else -}}
{{ index $v.external.urls .component }}
{{- end -}}
{{- end -}}

{{/* Environment every component gets. */}}
{{- define "ipamgc.env" -}}
{{- $combined := and (eq .component "watcher") .root.Values.combined -}}
{{- $leads := or (eq .component "leader") $combined -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "ipamgc.redisSecret" . }}
      key: url
{{- if $combined }}
{{- range $c := list "worker" "leader" }}
- name: IPAMGC_{{ upper $c }}_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "ipamgc.redisSecret" (dict "root" $.root "component" $c) }}
      key: url
{{- end }}
{{- end }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if ne .component "worker" }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if .root.Values.leakGracePeriod }}
- name: IPAMGC_LEAK_GRACE_PERIOD
  value: {{ .root.Values.leakGracePeriod | quote }}
{{- end }}
{{- if .root.Values.calicoApiGroup }}
- name: IPAMGC_CALICO_API_GROUP
  value: {{ .root.Values.calicoApiGroup | quote }}
{{- end }}
{{- end }}
{{- if and $leads (not (kindIs "invalid" .root.Values.leader.rateLimit)) }}
- name: IPAMGC_RATE_LIMIT
  value: {{ .root.Values.leader.rateLimit | toString | quote }}
{{- end }}
{{- if and $leads (not (kindIs "invalid" .root.Values.leader.deletedNodeRateLimit)) }}
- name: IPAMGC_DELETED_NODE_RATE_LIMIT
  value: {{ .root.Values.leader.deletedNodeRateLimit | toString | quote }}
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A component's Deployment: dict with root, component (watcher/worker/leader), verb (watch/work/lead), args
(extra), values (its block of values), serviceAccount (bool: mount a token).
*/}}
{{- define "ipamgc.deployment" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "ipamgc.fullname" $root) .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "ipamgc.labels" . | nindent 4 }}
    app.kubernetes.io/part-of: ipamgc
spec:
  {{- if not (and (eq .component "worker") $root.Values.worker.autoscaling.enabled) }}
  replicas: {{ .values.replicas }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "ipamgc.selector" . | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
  template:
    metadata:
      labels:
        {{- include "ipamgc.selector" . | nindent 8 }}
        app.kubernetes.io/part-of: ipamgc
        app.kubernetes.io/instance: {{ $root.Release.Name }}
      annotations:
        {{- if $root.Values.metrics.podAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $root.Values.metrics.port | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- if not (index $root.Values.redis.existingSecrets .component) }}
        checksum/redis-url: {{ include "ipamgc.redisURL" . | sha256sum | trunc 16 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      {{- if not .serviceAccount }}
      automountServiceAccountToken: false
      {{- end }}
      enableServiceLinks: false
      terminationGracePeriodSeconds: 30
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with (.values.priorityClassName | default $root.Values.priorityClassName) }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with .values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if .values.affinity }}
        {{- toYaml .values.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "ipamgc.selector" . | nindent 20 }}
        {{- end }}
      {{- with .values.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "ipamgc.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml (concat (list .verb "--log-format" $root.Values.logFormat) .args (.values.extraArgs | default list)) | nindent 12 }}
          env:
            {{- include "ipamgc.env" . | nindent 12 }}
            - name: IPAMGC_METRICS_PORT
              value: {{ $root.Values.metrics.port | quote }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          # Served from memory on the metrics port (ipamgc/healthz.py): no interpreter started, no Redis read.
          # /livez fails once the main loop stalls; /readyz also while shutting down.  A Redis outage
          # fails neither: it holds up no rollout.
          livenessProbe:
            httpGet:
              path: /livez
              port: metrics
            initialDelaySeconds: 10
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 5
            timeoutSeconds: 2
            failureThreshold: 2
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
{{- if $root.Values.podDisruptionBudgets.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "ipamgc.labels" . | nindent 4 }}
spec:
  maxUnavailable: 1  # never blocks a drain; the Lease's standby takes over
  selector:
    matchLabels:
      {{- include "ipamgc.selector" . | nindent 6 }}
{{- end }}
{{- end -}}
