"""The ipamgc domain: Calico IPAM models, the validity rules and everything else that does no I/O.

Owns: the models (`model`), parsing raw objects (`parse`), Calico's rules (`rules`, `allocrules`,
`podips`, `handlegc`, `consistency`), the records every component reads and writes and their codec
(`records`, `codec`: msgpack, bytes in and bytes out), names, keys (`keys`: every Redis key, as
strings), block operations, settings (`config`: frozen, pure), errors.

May import: the standard library and pure codecs (msgpack, msgspec, orjson, xxhash).  Never another
package of ipamgc, nor redis, rq, the Kubernetes client or urllib3 (import-linter, on the whole package):
the Redis edge is `redisio`, the Kubernetes edge `kubeio`.  Rules take data and `now`: domain functions
never read a clock (`clock.Clock` is what the entry points hand them) nor the network.
"""
