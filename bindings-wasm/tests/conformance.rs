//! The core's conformance suite compiled to wasm32 and run under wasm-bindgen-test (in Node): the same
//! contract the native stores pass, proven for the in-memory stores the JS package uses.
#![cfg(target_arch = "wasm32")]

use miniflow_core::conformance::{Harness, IdempotencyHarness};
use miniflow_core::{IdempotencyPolicy, MemoryIdempotencyStore, MemoryStore};

struct MemoryHarness;

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    fn open(&mut self) -> MemoryStore {
        MemoryStore::new()
    }

    /// A restart in the browser is a snapshot read back.
    fn reopen(&mut self, store: MemoryStore) -> MemoryStore {
        MemoryStore::from_snapshot(&store.export_snapshot()).expect("a snapshot reads back")
    }

    fn fail_commits_with_command_kind(&mut self, store: &mut MemoryStore, kind: &str) {
        store.fail_commits_with_command_kind(kind);
    }
}

impl IdempotencyHarness for MemoryHarness {
    type Store = MemoryIdempotencyStore;

    fn open(&mut self, policy: IdempotencyPolicy) -> MemoryIdempotencyStore {
        MemoryIdempotencyStore::new(policy).expect("a valid policy")
    }

    fn reopen(&mut self, store: MemoryIdempotencyStore) -> MemoryIdempotencyStore {
        store
    }
}

mod memory_store {
    miniflow_core::store_conformance_tests!(super::MemoryHarness, #[wasm_bindgen_test::wasm_bindgen_test]);
}

mod memory_idempotency {
    miniflow_core::idempotency_conformance_tests!(super::MemoryHarness, #[wasm_bindgen_test::wasm_bindgen_test]);
}
