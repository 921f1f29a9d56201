"""The Kubernetes versions deploy/ and the Helm chart are validated against (kubernetes-validate's schemas,
strict): the oldest and the newest this project checks.  kubernetes-validate 1.37 ships 1.25 to 1.37;
Calico 3.33 is built against Kubernetes 1.37.  .ci/deploy-checks reads this list too."""

from __future__ import annotations

KUBERNETES_VERSIONS = ("1.31", "1.37")
