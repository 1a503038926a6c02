// Command fetchjars fetches the Apache Kafka broker's jars that the tests run into their cache
// (see kafkacluster.Jars): the version given as an argument, each of several, or the pinned one.
// make kafka and .ci/run call it, so that a test's first cluster does not wait on Maven.
package main

import (
	"fmt"
	"os"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

func main() {
	versions := os.Args[1:]
	if len(versions) == 0 {
		versions = []string{kafkacluster.Version()}
	}
	for _, v := range versions {
		dir, err := kafkacluster.Jars(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("Kafka %s: %s\n", v, dir)
	}
}
