//! racecert's Redis command table: where each command's keys are, which commands only read,
//! which deliver work from a queue.

/// The positions (in `args`, the arguments after the name) of the keys a command touches, from
/// racecert's command table: strings, hashes, lists, sets, sorted sets, streams, scripts and
/// functions (`numkeys`), transactions (`WATCH`), generic key commands. Unknown commands, and
/// commands that name no key (`SCAN`, `KEYS` patterns, `PUBLISH` channels), give none.
/// `name` must be upper case.
pub fn command_keys(name: &str, args: &[&[u8]]) -> Vec<usize> {
    let n = args.len();
    let upper = |i: usize| {
        args.get(i)
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default()
    };
    let count = |i: usize| {
        args.get(i)
            .and_then(|a| std::str::from_utf8(a).ok())
            .and_then(|s| s.parse::<usize>().ok())
    };
    // `numkeys` at `at`, keys right after it.
    let numkeys = |at: usize| -> Vec<usize> {
        match count(at) {
            Some(k) => (at + 1..(at + 1 + k).min(n)).collect(),
            None => Vec::new(),
        }
    };
    let first = || -> Vec<usize> { if n > 0 { vec![0] } else { Vec::new() } };
    match name {
        // One key, first.
        "GET" | "SET" | "SETNX" | "SETEX" | "PSETEX" | "GETSET" | "GETDEL" | "GETEX" | "EXPIRE"
        | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" | "EXPIRETIME" | "PEXPIRETIME" | "PERSIST"
        | "TTL" | "PTTL" | "INCR" | "INCRBY" | "INCRBYFLOAT" | "DECR" | "DECRBY" | "APPEND"
        | "STRLEN" | "GETRANGE" | "SETRANGE" | "GETBIT" | "SETBIT" | "BITCOUNT" | "BITPOS"
        | "HSET" | "HSETNX" | "HGET" | "HDEL" | "HGETALL" | "HINCRBY" | "HINCRBYFLOAT"
        | "HMGET" | "HMSET" | "HEXISTS" | "HKEYS" | "HVALS" | "HLEN" | "HSTRLEN" | "HSCAN"
        | "HRANDFIELD" | "HEXPIRE" | "HPEXPIRE" | "HTTL" | "HPERSIST" | "LPUSH" | "RPUSH"
        | "LPUSHX" | "RPUSHX" | "LPOP" | "RPOP" | "LRANGE" | "LLEN" | "LREM" | "LINDEX"
        | "LSET" | "LTRIM" | "LINSERT" | "LPOS" | "SADD" | "SREM" | "SMEMBERS" | "SISMEMBER"
        | "SMISMEMBER" | "SCARD" | "SPOP" | "SRANDMEMBER" | "SSCAN" | "ZADD" | "ZREM"
        | "ZRANGE" | "ZRANGEBYSCORE" | "ZREVRANGEBYSCORE" | "ZRANGEBYLEX" | "ZREVRANGEBYLEX"
        | "ZREVRANGE" | "ZSCORE" | "ZMSCORE" | "ZINCRBY" | "ZCARD" | "ZCOUNT" | "ZLEXCOUNT"
        | "ZRANK" | "ZREVRANK" | "ZREMRANGEBYSCORE" | "ZREMRANGEBYRANK" | "ZREMRANGEBYLEX"
        | "ZPOPMIN" | "ZPOPMAX" | "ZRANDMEMBER" | "ZSCAN" | "XADD" | "XACK" | "XAUTOCLAIM"
        | "XCLAIM" | "XPENDING" | "XLEN" | "XRANGE" | "XREVRANGE" | "XDEL" | "XTRIM" | "XSETID"
        | "TYPE" | "DUMP" | "RESTORE" | "SORT" | "SORT_RO" | "PFADD" | "GEOADD" | "GEOPOS"
        | "GEODIST" | "GEOSEARCH" => first(),
        // Every argument is a key.
        "DEL" | "UNLINK" | "EXISTS" | "MGET" | "WATCH" | "TOUCH" | "SINTER" | "SUNION"
        | "SDIFF" | "PFCOUNT" | "PFMERGE" | "SINTERSTORE" | "SUNIONSTORE" | "SDIFFSTORE" => {
            (0..n).collect()
        }
        // key value pairs.
        "MSET" | "MSETNX" => (0..n).step_by(2).collect(),
        // Source and destination.
        "RENAME" | "RENAMENX" | "LMOVE" | "BLMOVE" | "RPOPLPUSH" | "BRPOPLPUSH" | "SMOVE"
        | "COPY" | "ZRANGESTORE" | "GEOSEARCHSTORE" => (0..n.min(2)).collect(),
        // Keys, then a timeout.
        "BLPOP" | "BRPOP" | "BZPOPMIN" | "BZPOPMAX" => (0..n.saturating_sub(1)).collect(),
        // Scripts and functions: script, numkeys, keys...
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO" => numkeys(1),
        // numkeys first.
        "ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" | "SINTERCARD" | "LMPOP" | "ZMPOP" => {
            numkeys(0)
        }
        "BLMPOP" | "BZMPOP" => numkeys(1),
        // destination, numkeys, keys...
        "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" => {
            let mut keys = first();
            keys.extend(numkeys(1));
            keys
        }
        "BITOP" => (1..n).collect(),
        // Subcommand, then the key.
        "XGROUP" | "XINFO" | "OBJECT" | "MEMORY" => match upper(0).as_slice() {
            b"HELP" | b"STATS" | b"DOCTOR" | b"MALLOC-STATS" | b"PURGE" => Vec::new(),
            _ if n > 1 => vec![1],
            _ => Vec::new(),
        },
        // Keys are the first half of what follows STREAMS.
        "XREAD" | "XREADGROUP" => match (0..n).find(|i| upper(*i) == b"STREAMS") {
            Some(at) => {
                let rest = n - at - 1;
                (at + 1..at + 1 + rest / 2).collect()
            }
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// Redis commands that only read, from Redis' command table (those flagged `readonly`); every
/// other command with keys may write them.
pub(crate) const REDIS_READS_ONLY: &[&str] = &[
    "GET",
    "MGET",
    "EXISTS",
    "TTL",
    "PTTL",
    "EXPIRETIME",
    "PEXPIRETIME",
    "TYPE",
    "STRLEN",
    "GETRANGE",
    "SUBSTR",
    "GETBIT",
    "BITCOUNT",
    "BITPOS",
    "BITFIELD_RO",
    "LCS",
    "DUMP",
    "TOUCH",
    "HGET",
    "HMGET",
    "HGETALL",
    "HEXISTS",
    "HKEYS",
    "HVALS",
    "HLEN",
    "HSTRLEN",
    "HSCAN",
    "HRANDFIELD",
    "HTTL",
    "HPTTL",
    "HEXPIRETIME",
    "LRANGE",
    "LLEN",
    "LINDEX",
    "LPOS",
    "SMEMBERS",
    "SISMEMBER",
    "SMISMEMBER",
    "SCARD",
    "SRANDMEMBER",
    "SSCAN",
    "SINTER",
    "SUNION",
    "SDIFF",
    "SINTERCARD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREVRANGEBYSCORE",
    "ZRANGEBYLEX",
    "ZREVRANGEBYLEX",
    "ZREVRANGE",
    "ZSCORE",
    "ZMSCORE",
    "ZCARD",
    "ZCOUNT",
    "ZLEXCOUNT",
    "ZRANK",
    "ZREVRANK",
    "ZRANDMEMBER",
    "ZSCAN",
    "ZUNION",
    "ZINTER",
    "ZDIFF",
    "ZINTERCARD",
    "XLEN",
    "XRANGE",
    "XREVRANGE",
    "XREAD",
    "XPENDING",
    "XINFO",
    "PFCOUNT",
    "GEOPOS",
    "GEODIST",
    "GEOSEARCH",
    "GEOHASH",
    "SORT_RO",
    "EVAL_RO",
    "EVALSHA_RO",
    "FCALL_RO",
    "OBJECT",
    "MEMORY",
    "WATCH",
];

/// Redis commands that deliver work from a queue (streams read by a group, blocking pops): the
/// harness decides who polls when, so stopping a worker before a poll orders nothing that
/// stopping it after its previous round trip does not.
pub(crate) const REDIS_POLLS: &[&str] = &[
    "XREADGROUP",
    "XAUTOCLAIM",
    "XCLAIM",
    "BLPOP",
    "BRPOP",
    "BLMOVE",
    "BRPOPLPUSH",
    "BLMPOP",
    "BZPOPMIN",
    "BZPOPMAX",
    "BZMPOP",
];

/// Whether the Redis command `name` (upper case) only reads its keys.
pub fn redis_reads_only(name: &str) -> bool {
    REDIS_READS_ONLY.contains(&name)
}
