//! Struct offsets, tracepoint arities and function names from the running kernel's BTF, and the one
//! parse of that BTF that aya's loader and every BTF-attached program share. Rust eBPF has no CO-RE
//! field relocations, so the loader reads the offsets here and hands them to the programs in
//! `CONFIG`.
//!
//! Memory: the kernel's BTF is several MB (5.3 MB on 6.18) and a type graph of it several times
//! that (btf-rs's cached graph took 35 MB of heap, aya's takes 13 MB). The few answers needed here
//! come from the raw section itself, with only an index of where each type starts (4 bytes per
//! type): nothing of the graph is built. [`KernelBtf::into_aya`] then parses the same bytes once
//! for aya, and the bytes go.
use std::{ops::Range, path::Path};

use observer_common::config::{ChargeConfig, MemcgOffsets, TaskOffsets};

use super::KernelError;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
/// `struct btf_header` up to `str_len`.
const HEADER_LEN: usize = 24;
/// `struct btf_type`: name_off, info, size/type.
const TYPE_LEN: usize = 12;

/// The BTF kinds (include/uapi/linux/btf.h) this module reads or has to step over.
mod kind {
    pub(crate) const INT: u8 = 1;
    pub(crate) const PTR: u8 = 2;
    pub(crate) const ARRAY: u8 = 3;
    pub(crate) const STRUCT: u8 = 4;
    pub(crate) const UNION: u8 = 5;
    pub(crate) const ENUM: u8 = 6;
    pub(crate) const FWD: u8 = 7;
    pub(crate) const TYPEDEF: u8 = 8;
    pub(crate) const VOLATILE: u8 = 9;
    pub(crate) const CONST: u8 = 10;
    pub(crate) const RESTRICT: u8 = 11;
    pub(crate) const FUNC: u8 = 12;
    pub(crate) const FUNC_PROTO: u8 = 13;
    pub(super) const VAR: u8 = 14;
    pub(crate) const DATASEC: u8 = 15;
    pub(crate) const FLOAT: u8 = 16;
    pub(crate) const DECL_TAG: u8 = 17;
    pub(crate) const TYPE_TAG: u8 = 18;
    pub(crate) const ENUM64: u8 = 19;
}

/// The kernel's BTF as read: the raw section and where each type starts in it.
pub(crate) struct KernelBtf {
    data: Vec<u8>,
    strings: Range<usize>,
    /// `starts[id - 1]`: byte offset of type `id` in `data` (id 0 is void).
    starts: Vec<u32>,
}

/// One type record, read in place.
#[derive(Clone, Copy)]
struct Ty {
    name_off: u32,
    kind: u8,
    vlen: usize,
    kind_flag: bool,
    /// `size` for structs, unions, ints...; `type` for pointers, typedefs, modifiers, functions.
    size_or_type: u32,
    /// Where the kind-specific data after the record starts.
    body: usize,
}

impl KernelBtf {
    pub(crate) fn load() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX))
    }

    pub(crate) fn from_file(path: &Path) -> Result<Self, KernelError> {
        if !path.exists() {
            return Err(KernelError::NoBtf(path.to_path_buf()));
        }
        let data = std::fs::read(path)
            .map_err(|e| KernelError::Btf(format!("reading {}: {e}", path.display())))?;
        Self::parse(data).map_err(|e| match e {
            KernelError::Btf(why) => KernelError::Btf(format!("parsing {}: {why}", path.display())),
            e => e,
        })
    }

    /// Indexes a raw BTF section (in this machine's byte order, as the kernel's is).
    pub(crate) fn parse(data: Vec<u8>) -> Result<Self, KernelError> {
        let bad = |why: &str| KernelError::Btf(why.to_string());
        if data.len() < HEADER_LEN || u16::from_ne_bytes([data[0], data[1]]) != MAGIC {
            return Err(bad(
                "no BTF header (bad magic: another byte order, or not BTF)",
            ));
        }
        let word = |at: usize| read_u32(&data, at).ok_or_else(|| bad("truncated header"));
        let hdr_len = word(4)? as usize;
        let section = |off: usize, len: usize| -> Result<Range<usize>, KernelError> {
            let start = hdr_len
                .checked_add(off)
                .ok_or_else(|| bad("section offset overflows"))?;
            let end = start
                .checked_add(len)
                .filter(|&end| end <= data.len())
                .ok_or_else(|| bad("section past the end of the data"))?;
            Ok(start..end)
        };
        let types = section(word(8)? as usize, word(12)? as usize)?;
        let strings = section(word(16)? as usize, word(20)? as usize)?;

        // The kernel's BTF has about one type per 36 bytes of type section.
        let mut starts = Vec::with_capacity(types.len() / 32);
        let mut at = types.start;
        while at < types.end {
            let info = read_u32(&data, at + 4).ok_or_else(|| bad("truncated type record"))?;
            let len = trailer_len(info).ok_or_else(|| {
                KernelError::Btf(format!(
                    "type {} has unknown kind {}",
                    starts.len() + 1,
                    kind_of(info)
                ))
            })?;
            let end = at + TYPE_LEN + len;
            if end > types.end {
                return Err(bad("type record past the end of the type section"));
            }
            starts.push(u32::try_from(at).map_err(|_| bad("BTF larger than 4 GiB"))?);
            at = end;
        }
        starts.shrink_to_fit();
        Ok(Self {
            data,
            strings,
            starts,
        })
    }

    /// Number of types (void not counted).
    #[cfg(test)]
    pub(crate) fn type_count(&self) -> usize {
        self.starts.len()
    }

    /// The same BTF parsed by aya, for the loader's relocations and the attach targets of
    /// `tp_btf` and `fentry` programs. Consumes the raw bytes: they are freed once aya has its copy.
    pub(crate) fn into_aya(self) -> Result<aya::Btf, KernelError> {
        let Self { data, starts, .. } = self;
        drop(starts);
        aya::Btf::parse(&data, aya::Endianness::default())
            .map_err(|e| KernelError::Btf(format!("aya: {e}")))
    }

    fn ty(&self, id: u32) -> Option<Ty> {
        let at = *self.starts.get((id as usize).checked_sub(1)?)? as usize;
        let info = read_u32(&self.data, at + 4)?;
        Some(Ty {
            name_off: read_u32(&self.data, at)?,
            kind: kind_of(info),
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: read_u32(&self.data, at + 8)?,
            body: at + TYPE_LEN,
        })
    }

    /// The NUL-terminated string at `off` in the string section ("" when out of range).
    fn string(&self, off: u32) -> &[u8] {
        let strings = &self.data[self.strings.clone()];
        let rest = strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// Every type called `name`, in id order.
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = Ty> + 'a {
        (1..=self.starts.len() as u32)
            .filter_map(|id| self.ty(id))
            .filter(move |t| self.string(t.name_off) == name.as_bytes())
    }

    /// Follows typedefs and modifiers (const, volatile, restrict, type tags) to the type they name.
    fn strip(&self, mut id: u32) -> Option<Ty> {
        for _ in 0..16 {
            let t = self.ty(id)?;
            match t.kind {
                kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous struct and union members
    /// (task_struct keeps many fields in them).
    pub(crate) fn member_offset(&self, name: &str, field: &str) -> Result<u32, KernelError> {
        // A name can have several types (a forward declaration, a struct); take the one that has it.
        for s in self.named(name).filter(|t| t.kind == kind::STRUCT) {
            if let Some(bits) = self.find_member(s, field, 0, 0) {
                if bits % 8 != 0 {
                    return Err(KernelError::Btf(format!("{name}.{field} is a bitfield")));
                }
                return Ok(bits / 8);
            }
        }
        Err(KernelError::Btf(format!(
            "struct {name} has no member {field}"
        )))
    }

    /// Bit offset of `field` in the struct or union `s`, `base_bits` into the outer struct.
    fn find_member(&self, s: Ty, field: &str, base_bits: u32, depth: u32) -> Option<u32> {
        if depth > 16 {
            return None;
        }
        for i in 0..s.vlen {
            let at = s.body + i * 12;
            let (name_off, ty, offset) = (
                read_u32(&self.data, at)?,
                read_u32(&self.data, at + 4)?,
                read_u32(&self.data, at + 8)?,
            );
            // With kind_flag set, the top 8 bits are the bitfield's size.
            let bits = base_bits
                + if s.kind_flag {
                    offset & 0xff_ffff
                } else {
                    offset
                };
            let name = self.string(name_off);
            if name == field.as_bytes() {
                return Some(bits);
            }
            if name.is_empty() {
                let inner = self
                    .strip(ty)
                    .filter(|t| matches!(t.kind, kind::STRUCT | kind::UNION));
                if let Some(found) = inner.and_then(|t| self.find_member(t, field, bits, depth + 1))
                {
                    return Some(found);
                }
            }
        }
        None
    }

    /// The value of `member` in `enum name` (one that fits 32 bits).
    pub(crate) fn enum_value(&self, name: &str, member: &str) -> Result<u32, KernelError> {
        for e in self.named(name).filter(|t| t.kind == kind::ENUM) {
            for i in 0..e.vlen {
                let at = e.body + i * 8;
                let (Some(name_off), Some(val)) =
                    (read_u32(&self.data, at), read_u32(&self.data, at + 4))
                else {
                    break;
                };
                if self.string(name_off) == member.as_bytes() {
                    return Ok(val);
                }
            }
        }
        Err(KernelError::Btf(format!("enum {name} has no {member}")))
    }

    /// `sizeof(struct name)`.
    pub(crate) fn struct_size(&self, name: &str) -> Result<u32, KernelError> {
        self.named(name)
            .find(|t| t.kind == kind::STRUCT && t.size_or_type > 0)
            .map(|t| t.size_or_type)
            .ok_or_else(|| KernelError::Btf(format!("struct {name} not found")))
    }

    /// Number of arguments of a BTF-enabled tracepoint, without the leading context pointer.
    pub(crate) fn tracepoint_arity(&self, tracepoint: &str) -> Result<usize, KernelError> {
        let typedef = format!("btf_trace_{tracepoint}");
        let mut cur = self
            .named(&typedef)
            .next()
            .ok_or_else(|| KernelError::TracepointMissing(tracepoint.to_string()))?;
        // typedef -> pointer -> function prototype (void *, args...)
        for _ in 0..4 {
            cur = match cur.kind {
                kind::FUNC_PROTO => return Ok(cur.vlen.saturating_sub(1)),
                kind::TYPEDEF | kind::PTR => self.ty(cur.size_or_type).ok_or_else(|| {
                    KernelError::Btf(format!("{typedef}: no type {}", cur.size_or_type))
                })?,
                _ => break,
            };
        }
        Err(KernelError::Btf(format!(
            "{typedef} is not a function pointer"
        )))
    }

    /// The struct the pointer argument `index` of a BTF-enabled tracepoint points at (`None`: not
    /// a pointer to a named struct), past the leading context pointer.
    pub(crate) fn tracepoint_arg_struct(
        &self,
        tracepoint: &str,
        index: usize,
    ) -> Result<Option<String>, KernelError> {
        let typedef = format!("btf_trace_{tracepoint}");
        let mut cur = self
            .named(&typedef)
            .next()
            .ok_or_else(|| KernelError::TracepointMissing(tracepoint.to_string()))?;
        for _ in 0..4 {
            match cur.kind {
                kind::FUNC_PROTO => {
                    // Parameters: (name_off, type) pairs; the first is the context.
                    let Some(ty) = read_u32(&self.data, cur.body + (index + 1) * 8 + 4)
                        .filter(|_| index + 1 < cur.vlen)
                    else {
                        return Ok(None);
                    };
                    let Some(ptr) = self.strip(ty).filter(|t| t.kind == kind::PTR) else {
                        return Ok(None);
                    };
                    return Ok(self
                        .strip(ptr.size_or_type)
                        .filter(|t| matches!(t.kind, kind::STRUCT | kind::FWD))
                        .map(|t| String::from_utf8_lossy(self.string(t.name_off)).into_owned()));
                }
                kind::TYPEDEF | kind::PTR => {
                    cur = self.ty(cur.size_or_type).ok_or_else(|| {
                        KernelError::Btf(format!("{typedef}: no type {}", cur.size_or_type))
                    })?
                }
                _ => break,
            }
        }
        Err(KernelError::Btf(format!(
            "{typedef} is not a function pointer"
        )))
    }

    /// Whether the kernel has a function of that name (one fentry programs can attach to).
    pub(crate) fn has_function(&self, name: &str) -> bool {
        self.named(name).any(|t| t.kind == kind::FUNC)
    }

    /// What the limit-hit probe reads from `struct mem_cgroup` (observer-ebpf/src/memcg.rs).
    pub(crate) fn memcg_offsets(&self) -> Result<MemcgOffsets, KernelError> {
        let memory = self.member_offset("mem_cgroup", "memory")?;
        Ok(MemcgOffsets {
            css_cgroup: self.member_offset("mem_cgroup", "css")?
                + self.member_offset("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: self.member_offset("cgroup", "kn")?,
            kn_id: self.member_offset("kernfs_node", "id")?,
            usage: memory + self.member_offset("page_counter", "usage")?,
            max: memory + self.member_offset("page_counter", "max")?,
            ..Default::default()
        })
    }

    /// What the charge probe reads (observer-ebpf/src/charge.rs): the page counter in
    /// `struct mem_cgroup`, and in it the usage, the limit and the parent's counter. The rest of
    /// [`ChargeConfig`] is the loader's choice.
    pub(crate) fn charge_offsets(&self) -> Result<ChargeConfig, KernelError> {
        Ok(ChargeConfig {
            memory: self.member_offset("mem_cgroup", "memory")?,
            pc_usage: self.member_offset("page_counter", "usage")?,
            pc_max: self.member_offset("page_counter", "max")?,
            pc_parent: self.member_offset("page_counter", "parent")?,
            task_cgroups: self.member_offset("task_struct", "cgroups")?,
            css_set_subsys: self.member_offset("css_set", "subsys")?,
            memory_cgrp_id: self.enum_value("cgroup_subsys_id", "memory_cgrp_id")?,
            memcg_css: self.member_offset("mem_cgroup", "css")?,
            ..Default::default()
        })
    }

    pub(crate) fn task_offsets(&self) -> Result<TaskOffsets, KernelError> {
        Ok(TaskOffsets {
            exit_code: self.member_offset("task_struct", "exit_code")?,
            real_parent: self.member_offset("task_struct", "real_parent")?,
            tgid: self.member_offset("task_struct", "tgid")?,
            signal: self.member_offset("task_struct", "signal")?,
            signal_live: self.member_offset("signal_struct", "live")?,
            bprm_filename: self.member_offset("linux_binprm", "filename")?,
            thread_pid: self.member_offset("task_struct", "thread_pid")?,
            pid_level: self.member_offset("pid", "level")?,
            pid_numbers: self.member_offset("pid", "numbers")?,
            upid_nr: self.member_offset("upid", "nr")?,
            upid_size: self.struct_size("upid")?,
            signal_oom_score_adj: self.member_offset("signal_struct", "oom_score_adj")?,
        })
    }
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

fn kind_of(info: u32) -> u8 {
    ((info >> 24) & 0x1f) as u8
}

/// Bytes of kind-specific data after a type record; `None` for a kind this reader does not know
/// (its length is unknown, so nothing after it could be read).
fn trailer_len(info: u32) -> Option<usize> {
    let vlen = (info & 0xffff) as usize;
    Some(match kind_of(info) {
        kind::INT | kind::VAR | kind::DECL_TAG => 4,
        kind::ARRAY => 12,
        kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => vlen * 12,
        kind::ENUM | kind::FUNC_PROTO => vlen * 8,
        kind::PTR
        | kind::FWD
        | kind::TYPEDEF
        | kind::VOLATILE
        | kind::CONST
        | kind::RESTRICT
        | kind::FUNC
        | kind::FLOAT
        | kind::TYPE_TAG => 0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn btf() -> Option<KernelBtf> {
        if !Path::new(VMLINUX).exists() {
            eprintln!("skipping: {VMLINUX} absent (kernel without BTF)");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true requires kernel BTF"
            );
            return None;
        }
        Some(KernelBtf::load().expect("parse vmlinux BTF"))
    }

    #[test]
    fn task_offsets_are_plausible_and_distinct() {
        let Some(btf) = btf() else { return };
        let o = btf.task_offsets().unwrap();
        // task_struct is kilobytes long; every field we use sits well past its first cache line
        // and the fields are distinct.
        let fields = [o.exit_code, o.real_parent, o.tgid, o.signal];
        for f in fields {
            assert!(f > 64 && f < 16384, "{o:?}");
        }
        let mut sorted = fields.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), fields.len());
        // `bpftool btf dump file /sys/kernel/btf/vmlinux` on the 6.18.44 kernel this was first
        // checked on puts exit_code at bit 9312 (a cross-check of the BTF walk, not a constant).
        if std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .is_ok_and(|r| r.starts_with("6.18."))
        {
            assert_eq!(o.exit_code * 8, 9312);
        }
    }

    #[test]
    fn memcg_offsets_are_found_and_distinct() {
        let Some(btf) = btf() else { return };
        let m = btf.memcg_offsets().expect("memcg offsets");
        assert_ne!(m.usage, m.max, "{m:?}");
        assert!(m.usage > 0 && m.max > 0 && m.cgroup_kn > 0, "{m:?}");
    }

    #[test]
    fn charge_offsets_are_found_and_distinct() {
        let Some(btf) = btf() else { return };
        let c = btf.charge_offsets().expect("charge offsets");
        // usage leads the page counter; max and parent follow it, apart.
        assert_eq!(c.pc_usage, 0, "{c:?}");
        assert!(c.pc_max > 0 && c.pc_parent > c.pc_max, "{c:?}");
        // The memory controller is one of the few compiled in: its id indexes css_set.subsys.
        assert!(c.memory_cgrp_id < 16, "{c:?}");
        assert!(btf.enum_value("cgroup_subsys_id", "no_such_id").is_err());
        // The counter of struct mem_cgroup is the one the limit-hit probe reads.
        let m = btf.memcg_offsets().unwrap();
        assert_eq!(m.usage, c.memory + c.pc_usage);
        assert_eq!(m.max, c.memory + c.pc_max);
    }

    #[test]
    fn a_tracepoint_argument_is_named_by_its_struct() {
        let Some(btf) = btf() else { return };
        assert_eq!(
            btf.tracepoint_arg_struct("sched_process_exec", 0).unwrap(),
            Some("task_struct".to_string())
        );
        // pid_t old_pid: not a pointer.
        assert_eq!(
            btf.tracepoint_arg_struct("sched_process_exec", 1).unwrap(),
            None
        );
        assert_eq!(
            btf.tracepoint_arg_struct("sched_process_exec", 9).unwrap(),
            None
        );
        // Linux 6.14+: the statistics' tracepoint the charge probe falls back on.
        if btf.tracepoint_arity("mod_memcg_lruvec_state").is_ok() {
            assert_eq!(
                btf.tracepoint_arg_struct("mod_memcg_lruvec_state", 0)
                    .unwrap()
                    .as_deref(),
                Some("mem_cgroup")
            );
        }
    }

    #[test]
    fn missing_member_is_a_clear_error() {
        let Some(btf) = btf() else { return };
        let err = btf
            .member_offset("task_struct", "no_such_field")
            .unwrap_err();
        assert!(err.to_string().contains("no member no_such_field"), "{err}");
    }

    #[test]
    fn functions_are_found_by_name() {
        let Some(btf) = btf() else { return };
        assert!(btf.has_function("do_exit"));
        assert!(
            !btf.has_function("task_struct"),
            "a struct is not a function"
        );
        assert!(!btf.has_function("no_such_function_observer"));
    }

    #[test]
    fn sched_process_exit_arity() {
        let Some(btf) = btf() else { return };
        let n = btf.tracepoint_arity("sched_process_exit").unwrap();
        assert!(n == 1 || n == 2, "{n}");
        assert_eq!(btf.tracepoint_arity("sched_process_exec").unwrap(), 3);
    }

    #[test]
    fn every_type_of_the_kernel_is_indexed_and_aya_reads_the_same_bytes() {
        let Some(btf) = btf() else { return };
        assert!(btf.type_count() > 1000, "{} types", btf.type_count());
        // The index ends exactly where the type section does, and aya's parse of the same bytes
        // writes them back whole: both walked every record the same way.
        let len = btf.data.len();
        let aya = btf.into_aya().unwrap();
        assert_eq!(aya.to_bytes().len(), len);
    }

    /// A hand-made BTF section: the walk's rules without a kernel.
    struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        fn new() -> Self {
            Self {
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }

        fn name(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn words(&mut self, words: &[u32]) {
            for w in words {
                self.types.extend_from_slice(&w.to_ne_bytes());
            }
        }

        /// A type record; returns its id.
        fn ty(&mut self, name: &str, kind: u8, vlen: u32, flag: bool, size_or_type: u32) -> u32 {
            let name = self.name(name);
            let info = (u32::from(flag) << 31) | (u32::from(kind) << 24) | vlen;
            self.words(&[name, info, size_or_type]);
            self.next_id += 1;
            self.next_id - 1
        }

        fn member(&mut self, name: &str, ty: u32, offset: u32) {
            let name = self.name(name);
            self.words(&[name, ty, offset]);
        }

        fn build(self) -> Vec<u8> {
            let mut out = Vec::new();
            for w in [
                u32::from(MAGIC) | (1 << 16), // magic, version 1, flags 0
                HEADER_LEN as u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&w.to_ne_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    #[test]
    fn the_walk_reads_a_hand_made_section() {
        let mut b = Builder::new();
        let int = b.ty("int", kind::INT, 0, false, 4);
        b.words(&[32]); // the int's encoding
        let _fwd = b.ty("task", kind::FWD, 0, false, 0);
        // union { int a; struct { int deep; } } inside a const, after a bitfield struct member.
        let inner = b.ty("", kind::STRUCT, 1, false, 4);
        b.member("deep", int, 0);
        let anon = b.ty("", kind::UNION, 2, false, 4);
        b.member("a", int, 0);
        b.member("", inner, 0);
        let konst = b.ty("", kind::CONST, 0, false, anon);
        b.ty("task", kind::STRUCT, 4, true, 16);
        b.member("flags", int, 3 << 24); // 3-bit bitfield at bit 0
        b.member("odd", int, (5 << 24) | 3); // a bitfield not on a byte
        b.member("", konst, 64);
        b.member("tail", int, 96);
        let proto = b.ty("", kind::FUNC_PROTO, 3, false, 0);
        b.words(&[0, 0, 0, int, 0, int]);
        let ptr = b.ty("", kind::PTR, 0, false, proto);
        b.ty("btf_trace_demo", kind::TYPEDEF, 0, false, ptr);
        b.ty("demo_fn", kind::FUNC, 0, false, proto);
        b.ty("gone", kind::STRUCT, 0, false, 0);
        let btf = KernelBtf::parse(b.build()).unwrap();

        assert_eq!(btf.type_count(), 11);
        assert_eq!(btf.member_offset("task", "flags").unwrap(), 0);
        assert_eq!(btf.member_offset("task", "deep").unwrap(), 8);
        assert_eq!(btf.member_offset("task", "a").unwrap(), 8);
        assert_eq!(btf.member_offset("task", "tail").unwrap(), 12);
        assert!(btf
            .member_offset("task", "odd")
            .unwrap_err()
            .to_string()
            .contains("bitfield"));
        assert!(btf
            .member_offset("task", "nope")
            .unwrap_err()
            .to_string()
            .contains("struct task has no member nope"));
        assert_eq!(btf.struct_size("task").unwrap(), 16);
        assert!(
            btf.struct_size("gone").is_err(),
            "a size-0 struct is a declaration"
        );
        assert_eq!(btf.tracepoint_arity("demo").unwrap(), 2);
        assert!(matches!(
            btf.tracepoint_arity("absent"),
            Err(KernelError::TracepointMissing(_))
        ));
        assert!(btf.has_function("demo_fn"));
        assert!(!btf.has_function("task"));
    }

    #[test]
    fn a_damaged_section_is_an_error_not_a_panic() {
        let mut b = Builder::new();
        let int = b.ty("int", kind::INT, 0, false, 4);
        b.words(&[32]);
        let s = b.ty("s", kind::STRUCT, 1, false, 4);
        b.member("x", int, 0);
        assert_eq!(s, 2);
        let good = b.build();
        assert!(KernelBtf::parse(good.clone()).is_ok());

        // Cut inside the struct's member list: the header still promises the whole section.
        assert!(KernelBtf::parse(good[..good.len() - 10].to_vec()).is_err());
        // Another byte order, or not BTF at all.
        let mut swapped = good.clone();
        swapped.swap(0, 1);
        assert!(KernelBtf::parse(swapped).is_err());
        assert!(KernelBtf::parse(vec![0; 8]).is_err());
        // A struct claiming more members than the section holds.
        let mut long = good;
        let info_at = HEADER_LEN + 16 + 4; // the struct record's info word
        long[info_at..info_at + 4]
            .copy_from_slice(&((u32::from(kind::STRUCT) << 24) | 500).to_ne_bytes());
        assert!(KernelBtf::parse(long).is_err());
    }
}
