package outbox

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
)

// MaxShards bounds Config.Shards: each shard is a partition of the leader topic, a producer with a
// transactional ID of its own and an index range, and a few hundred of them is already more than
// one outbox table can feed.
const MaxShards = 256

// Shard returns the shard, in [0, shards), of a record with the given key. It is the first 28
// bits of the key's MD5 digest modulo shards: MD5 because Postgres has it built in and it gives
// the same digest everywhere, on every version and platform (unlike Postgres's own hash
// functions, which it does not promise to keep), so the harvester, an index and a writer in any
// language agree on a key's shard. A text key is hashed as its bytes in the database encoding
// (UTF-8, normally). Shard and ShardSQL compute the same function.
func Shard(key []byte, shards int) int {
	if shards <= 1 {
		return 0
	}
	sum := md5.Sum(key)
	return int(binary.BigEndian.Uint32(sum[:4])>>4) % shards
}

// ShardSQL is Shard as a Postgres expression over the key column (text or bytea). The harvester
// filters each shard's mark with exactly this text (ShardMarkClauses), so that Postgres uses the
// index that ShardIndexDDL creates on it.
func ShardSQL(keyColumn string, shards int) string {
	return fmt.Sprintf(`(('x' || left(md5(%s), 7))::bit(28)::int %% %d)`, keyColumn, shards)
}
