// Command etcd is etcd's server, built from its module (go.etcd.io/etcd/server/v3) at the
// version go.mod pins: etcd's own main package lives in a module whose replace directives
// point into its repository, so it cannot be built from the module proxy as it is. This
// program only calls the server's entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
