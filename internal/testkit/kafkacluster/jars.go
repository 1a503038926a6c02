package kafkacluster

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// DefaultVersion is the Kafka version tests run unless GOHARVEST_KAFKA_VERSION names another.
// docs/operations.md lists the versions tested; `make kafka-versions` runs the Kafka tests on each.
const DefaultVersion = "4.4.0"

// EnvVersion picks the Kafka version; EnvCache the directory the jars are kept in.
const (
	EnvVersion = "GOHARVEST_KAFKA_VERSION"
	EnvCache   = "GOHARVEST_KAFKA_CACHE"
)

//go:embed pom.xml
var pom []byte

// Version returns the Kafka version the tests run.
func Version() string {
	if v := strings.TrimSpace(os.Getenv(EnvVersion)); v != "" {
		return v
	}
	return DefaultVersion
}

// CacheDir is where the jars of each version are kept: GOHARVEST_KAFKA_CACHE, or goharvest/kafka
// under the user's cache directory (~/.cache on Linux).
func CacheDir() (string, error) {
	if dir := os.Getenv(EnvCache); dir != "" {
		return dir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kafkacluster: no cache directory (set %s): %w", EnvCache, err)
	}
	return filepath.Join(base, "goharvest", "kafka"), nil
}

// Jars returns the directory holding the broker's jars for version, fetching them from Maven
// Central with mvn on first use. A file lock keeps test binaries that start at once (go test runs
// packages in parallel by default) from fetching into the same place together.
func Jars(version string) (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, version)
	complete := filepath.Join(dir, ".complete")
	if _, err := os.Stat(complete); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("kafkacluster: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("kafkacluster: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("kafkacluster: lock %s: %w", cache, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(complete); err == nil {
		return dir, nil // another process fetched them while this one waited
	}
	if err := fetch(version, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// fetch copies Kafka's jars and their dependencies into dir with Maven.
func fetch(version, dir string) error {
	if _, err := exec.LookPath("mvn"); err != nil {
		return errors.New("kafkacluster: the tests run Apache Kafka from Maven Central's jars and need mvn " +
			"(Debian: apt-get install maven) and Java 17 or later")
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), "fetch-")
	if err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	defer os.RemoveAll(work)
	if err := os.WriteFile(filepath.Join(work, "pom.xml"), pom, 0o644); err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	jars := filepath.Join(work, "jars")
	cmd := exec.Command("mvn", "-q", "-B", "-f", filepath.Join(work, "pom.xml"),
		"dependency:copy-dependencies", "-Dkafka.version="+version, "-DoutputDirectory="+jars)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kafkacluster: fetch Kafka %s with mvn: %w\n%s", version, err, out)
	}
	if err := os.WriteFile(filepath.Join(jars, ".complete"), []byte(version+"\n"), 0o644); err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	os.RemoveAll(dir) // a fetch that stopped half-way
	if err := os.Rename(jars, dir); err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	return nil
}
