//! Tests of `CallTree`: paths, merging in any order, the wire form.

use super::*;

/// `rank: a > b > c` lines, one thread each.
fn tree(stacks: &str) -> CallTree {
    let mut t = CallTree::new();
    for line in stacks.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (rank, frames) = line.split_once(':').unwrap();
        let frames: Vec<&str> = frames
            .split('>')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        t.insert(rank.trim().parse().unwrap(), &frames);
    }
    t
}

/// The paths as `[ranks] a > b` lines.
fn paths(t: &CallTree) -> String {
    let line = |(r, p): (RankSet, Vec<String>)| format!("[{r}] {}\n", p.join(" > "));
    t.paths().into_iter().map(line).collect()
}

fn check(stacks: &str, expect: &str) {
    let t = tree(stacks);
    let expect: String = expect
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(paths(&t), expect, "stacks:\n{stacks}");
}

#[test]
fn paths_group_ranks_by_leaf() {
    check(
        "0: main > barrier > poll
         1: main > compute
         2: main > barrier > poll
         3: main > barrier > poll",
        "[0,2-3] main > barrier > poll
         [1] main > compute",
    );
}

#[test]
fn paths_are_ordered_by_first_rank_then_name() {
    check(
        "5: main > b
         0: main > z
         0: main > a
         3: main > b",
        "[0] main > a
         [0] main > z
         [3,5] main > b",
    );
}

#[test]
fn a_stack_that_is_a_prefix_of_another_ends_inside() {
    // Rank 1 stops in `barrier` while rank 0 is deeper; rank 2's second thread stops in `main`.
    check(
        "0: main > barrier > poll
         1: main > barrier
         2: main > barrier > poll
         2: main",
        "[0,2] main > barrier > poll
         [1] main > barrier
         [2] main",
    );
}

#[test]
fn an_empty_stack_counts_the_rank_at_the_root() {
    let mut t = tree("0: main");
    t.insert::<String>(7, &[]);
    assert_eq!(t.ranks().to_string(), "0,7");
    assert_eq!(paths(&t), "[0] main\n[7] \n");
}

#[test]
fn nodes_hold_ranks_and_sorted_children() {
    let t = tree("0: main > b\n1: main > a\n2: other");
    let names: Vec<_> = t
        .root()
        .preorder()
        .map(|(d, n)| format!("{d}:{}", n.name()))
        .collect();
    assert_eq!(names, ["0:", "1:main", "2:a", "2:b", "1:other"]);
    let main = &t.root().children()[0];
    assert_eq!(
        (main.ranks().to_string(), main.ends().len()),
        ("0-1".to_string(), 0)
    );
}

/// xorshift64: a seeded generator, enough to shuffle without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random stacks over a small alphabet, so paths share prefixes and some end inside others.
fn random_stacks(rng: &mut Rng) -> Vec<(u32, Vec<String>)> {
    let names = ["main", "a", "b", "c", "MPI_Barrier", "poll"];
    let n = 1 + rng.below(40);
    (0..n)
        .map(|_| {
            let rank = rng.below(64) as u32;
            let depth = rng.below(5);
            let frames = (0..depth)
                .map(|_| names[rng.below(names.len())].to_string())
                .collect();
            (rank, frames)
        })
        .collect()
}

#[test]
fn merge_in_any_grouping_and_order_equals_one_insert() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..300 {
        let stacks = random_stacks(&mut rng);
        let mut whole = CallTree::new();
        for (rank, frames) in &stacks {
            whole.insert(*rank, frames);
        }
        // Deal the stacks into random groups, then merge random pairs until one tree is left:
        // this covers every grouping and order of a daemon tree.
        let mut pool = vec![CallTree::new(); 1 + rng.below(6)];
        for (rank, frames) in &stacks {
            let i = rng.below(pool.len());
            pool[i].insert(*rank, frames);
        }
        while pool.len() > 1 {
            let a = pool.swap_remove(rng.below(pool.len()));
            let i = rng.below(pool.len());
            pool[i].merge(a);
        }
        assert_eq!(pool[0], whole, "round {round}: {stacks:?}");
        let wire = serde_json::to_string(&whole).unwrap();
        assert_eq!(
            serde_json::from_str::<CallTree>(&wire).unwrap(),
            whole,
            "round {round}: {wire}"
        );
    }
}

#[test]
fn wire_form_is_flat_and_short() {
    let t = tree(
        "0: main > barrier > poll
         1: main > barrier
         2: main > compute
         3: main > barrier > poll",
    );
    let wire = serde_json::to_string(&t).unwrap();
    assert_eq!(
        wire,
        r#"[[0,"","0-3"],[1,"main","0-3"],[2,"barrier","0-1,3","1"],[3,"poll","0,3"],[2,"compute","2"]]"#
    );
    assert_eq!(serde_json::from_str::<CallTree>(&wire).unwrap(), t);
}

#[test]
fn wire_form_survives_deep_stacks() {
    let frames: Vec<String> = (0..1000).map(|i| format!("f{i}")).collect();
    let mut t = CallTree::new();
    t.insert(3, &frames);
    let back: CallTree = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
}

#[test]
fn wire_form_refuses_what_is_not_a_preorder() {
    let check = |wire: &str, expect: &str| {
        let err = serde_json::from_str::<CallTree>(wire)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{wire}: {err}");
    };
    check(r#"[[1,"main","0"]]"#, "entry 0: depth 1 out of place");
    check(
        r#"[[0,"","0"],[2,"main","0"]]"#,
        "entry 1: depth 2 out of place",
    );
    check(
        r#"[[0,"","0"],[0,"x","0"]]"#,
        "entry 1: depth 0 out of place",
    );
    check(
        r#"[[0,"","0-1"],[1,"b","0"],[1,"a","1"]]"#,
        "children of \"\" out of order",
    );
    check(r#"[[0,"","0-1"],[1,"a","0"],[1,"a","1"]]"#, "out of order");
    check(r#"[[0,""]]"#, "invalid length 2");
    check(r#"[[0,"","x"]]"#, "rank set \"x\"");
    assert_eq!(
        serde_json::from_str::<CallTree>("[]").unwrap(),
        CallTree::new()
    );
}
