"""The Kubernetes edge shared by the watcher (`producer/`) and the workers and leader (`workers/`).

`producer/` and `workers/` may not import each other and `shared/` may not touch `kubernetes`, so what
both need from the API server lives here: raw JSON requests over the official client's configuration
and connection pool (`kubeio.http`), and the Lease election (`kubeio.lease`).  Only this package and the
components' own adapter modules import `kubernetes`.
"""
