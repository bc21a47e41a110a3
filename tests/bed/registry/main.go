// The test bed's OCI registry: go-containerregistry's registry package (what its `registry` and
// `crane registry serve` commands serve) with the OCI 1.1 referrers API on, which neither command
// turns on, and blobs on disk. Plain HTTP on the given loopback address. Built by build.sh into
// the binary cache; nothing here is shipped.
package main

import (
	"flag"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	address := flag.String("address", "127.0.0.1:0", "host:port to listen on")
	disk := flag.String("disk", "", "directory for blobs (manifests stay in memory)")
	flag.Parse()
	if *disk == "" {
		log.Fatal("--disk is required")
	}
	if err := os.MkdirAll(*disk, 0o755); err != nil {
		log.Fatal(err)
	}
	server := &http.Server{
		Addr:              *address,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: registry.New(
			registry.WithBlobHandler(registry.NewDiskBlobHandler(*disk)),
			registry.WithReferrersSupport(true),
		),
	}
	log.Printf("serving on %s", *address)
	log.Fatal(server.ListenAndServe())
}
