// ElasticBatchDataset: this worker's slice of each global batch, resharded at
// runtime.
//
// The world size, this worker's rank and the global cursor (the next global
// batch of the current pass) are int64 variables read at every GetNext, so a
// membership change needs no pipeline rebuild. GetNext advances the cursor
// variable itself, at hand-out: as long as nothing buffers elements after this
// dataset, the cursor always equals the number of global batches handed to the
// training step, so committing it and assigning it back is an exact rollback,
// and a newcomer given the cursor starts exactly there. Batches prepared ahead
// (indexed inputs only) are handed out only if they were cut for the state
// read at hand-out.
#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cc/kernels/elastic_batch_plan.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/framework/partial_tensor_shape.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_util.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/strcat.h"
#include "tensorflow/core/util/batch_util.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::DataTypeVector;
using tensorflow::DT_INT64;
using tensorflow::DT_RESOURCE;
using tensorflow::mutex;
using tensorflow::mutex_lock;
using tensorflow::Node;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::ResourceHandle;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::data::CardinalityOptions;
using tensorflow::data::DatasetBase;
using tensorflow::data::DatasetContext;
using tensorflow::data::DatasetIterator;
using tensorflow::data::IndexMapperFn;
using tensorflow::data::IteratorBase;
using tensorflow::data::IteratorContext;
using tensorflow::data::IteratorStateReader;
using tensorflow::data::IteratorStateWriter;
using tensorflow::data::kInfiniteCardinality;
using tensorflow::data::kUnknownCardinality;
using tensorflow::data::SerializationContext;
using tensorflow::data::UnaryDatasetOpKernel;

constexpr char kDatasetType[] = "ElasticBatch";
constexpr char kGlobalBatchSize[] = "global_batch_size";
constexpr char kInputCardinality[] = "input_cardinality";
constexpr char kCursor[] = "cursor";
constexpr char kExhausted[] = "exhausted";
constexpr char kStreamPosition[] = "stream_position";
constexpr char kInputExhausted[] = "input_exhausted";
constexpr char kInputImplEmpty[] = "input_impl_empty";
// Batches prepared ahead at least (more if there are more producers): one
// for the step that follows, one to keep a producer busy through a hand-out.
constexpr int64_t kMinLookaheadBatches = 2;
// The generation of a production that nothing supersedes (GetNext's own).
constexpr int64_t kNotAbortable = -1;

// A scalar int64 resource variable owned by the strategy.
class StateVariable {
 public:
  static absl::Status FromInput(OpKernelContext* ctx, int index, const char* name,
                                StateVariable* out) {
    out->name_ = name;
    out->handle_tensor_ = ctx->input(index);
    if (out->handle_tensor_.dtype() != DT_RESOURCE || out->handle_tensor_.NumElements() != 1) {
      return tensorflow::errors::InvalidArgument(name, " must be a scalar resource variable");
    }
    const ResourceHandle& handle = out->handle_tensor_.scalar<ResourceHandle>()();
    TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, handle, &out->var_));
    return out->Read().status();
  }

  absl::StatusOr<int64_t> Read() const {
    tensorflow::tf_shared_lock lock(*var_->mu());
    const Tensor& value = *var_->tensor();
    if (!var_->is_initialized || value.dtype() != DT_INT64 || value.dims() != 0) {
      return tensorflow::errors::InvalidArgument(
          name_, " must be an initialized scalar int64 variable, got ",
          var_->is_initialized ? var_->DebugString() : "an uninitialized variable");
    }
    return value.scalar<int64_t>()();
  }

  // Replaces the buffer rather than writing in place: readers may still hold
  // the old one.
  void Write(int64_t value) const {
    Tensor fresh(DT_INT64, TensorShape({}));
    fresh.scalar<int64_t>()() = value;
    mutex_lock lock(*var_->mu());
    *var_->tensor() = std::move(fresh);
  }

  const Tensor& handle_tensor() const { return handle_tensor_; }

 private:
  std::string name_;
  Tensor handle_tensor_;
  tensorflow::core::RefCountPtr<Var> var_;
};

class ElasticBatchDatasetOp : public UnaryDatasetOpKernel {
 public:
  explicit ElasticBatchDatasetOp(OpKernelConstruction* ctx) : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("drop_remainder", &drop_remainder_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("local_replicas", &local_replicas_));
    OP_REQUIRES(ctx, local_replicas_ >= 1,
                tensorflow::errors::InvalidArgument("local_replicas must be >= 1, got ",
                                                    local_replicas_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, DatasetBase* input, DatasetBase** output) override;

 private:
  class Dataset;
  bool drop_remainder_ = false;
  int64_t local_replicas_ = 1;
};

class ElasticBatchDatasetOp::Dataset : public DatasetBase {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input, int64_t global_batch_size,
          bool drop_remainder, int64_t local_replicas, StateVariable world_size,
          StateVariable rank, StateVariable cursor)
      : DatasetBase(DatasetContext(ctx)),
        input_(input),
        global_batch_size_(global_batch_size),
        drop_remainder_(drop_remainder),
        local_replicas_(local_replicas),
        world_size_(std::move(world_size)),
        rank_(std::move(rank)),
        cursor_(std::move(cursor)),
        input_cardinality_(input->Cardinality()),
        // Random access needs a known size to tell where a pass ends.
        random_access_(input->RandomIndexingCompatible().ok() && input_cardinality_ >= 0) {
    input_->Ref();
    for (const PartialTensorShape& shape : input_->output_shapes()) {
      output_shapes_.push_back(PartialTensorShape({-1}).Concatenate(shape));
    }
  }

  ~Dataset() override { input_->Unref(); }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(const std::string& prefix) const override;

  const DataTypeVector& output_dtypes() const override { return input_->output_dtypes(); }

  const std::vector<PartialTensorShape>& output_shapes() const override {
    return output_shapes_;
  }

  std::string DebugString() const override {
    return tensorflow::strings::StrCat(kDatasetType, "DatasetOp(", global_batch_size_, ")::Dataset");
  }

  // Global batches in a full pass; the world size does not change it.
  int64_t CardinalityInternal(CardinalityOptions options) const override {
    const int64_t n = input_->Cardinality(options);
    if (n == kInfiniteCardinality || n == kUnknownCardinality) return n;
    return drop_remainder_ ? n / global_batch_size_
                           : (n + global_batch_size_ - 1) / global_batch_size_;
  }

  absl::Status InputDatasets(std::vector<const DatasetBase*>* inputs) const override {
    inputs->push_back(input_);
    return absl::OkStatus();
  }

  // The variables are the strategy's state, committed and restored by it; the
  // iterator's own checkpoint is complete relative to them.
  absl::Status CheckExternalState() const override { return input_->CheckExternalState(); }

 protected:
  absl::Status AsGraphDefInternal(SerializationContext* ctx, DatasetGraphDefBuilder* b,
                                  Node** output) const override {
    // tf.data rewrites (optimizations, autotune) serialize the pipeline and
    // rebuild it in this process: feed the very handles back through
    // placeholders so the rebuilt dataset reads the same variables.
    if (!ctx->is_graph_rewrite() || ctx->input_list() == nullptr) {
      return tensorflow::errors::Unimplemented(
          "An elastic dataset reads the strategy's world-size, rank and cursor variables and "
          "cannot be serialized into a standalone graph (tf.data service, SavedModel); build "
          "it in the training process instead");
    }
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    Node* global_batch_size_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddScalar(global_batch_size_, &global_batch_size_node));
    std::vector<Node*> inputs = {input_node, global_batch_size_node};
    for (const StateVariable* variable : {&world_size_, &rank_, &cursor_}) {
      Node* handle_node = nullptr;
      TF_RETURN_IF_ERROR(b->AddPlaceholder(variable->handle_tensor(), &handle_node));
      ctx->input_list()->emplace_back(handle_node->name(), variable->handle_tensor());
      inputs.push_back(handle_node);
    }
    tensorflow::AttrValue drop_remainder;
    b->BuildAttrValue(drop_remainder_, &drop_remainder);
    tensorflow::AttrValue local_replicas;
    b->BuildAttrValue(local_replicas_, &local_replicas);
    return b->AddDataset(this, inputs,
                         {{"drop_remainder", drop_remainder}, {"local_replicas", local_replicas}},
                         output);
  }

 private:
  class Iterator;

  const DatasetBase* const input_;
  const int64_t global_batch_size_;
  const bool drop_remainder_;
  // Consecutive replicas this worker drives: its slice is theirs (ComputeReplicaRangeSlice).
  const int64_t local_replicas_;
  const StateVariable world_size_;
  const StateVariable rank_;
  const StateVariable cursor_;
  const int64_t input_cardinality_;
  const bool random_access_;
  std::vector<PartialTensorShape> output_shapes_;
};

class ElasticBatchDatasetOp::Dataset::Iterator : public DatasetIterator<Dataset> {
 public:
  explicit Iterator(const Params& params) : DatasetIterator<Dataset>(params) {}

  ~Iterator() override {
    {
      mutex_lock lock(mu_);
      cancelled_ = true;
      ++generation_;
      changed_.notify_all();
    }
    for (std::unique_ptr<Producer>& producer : producers_) producer->thread.reset();  // joins
  }

  absl::Status GetNextInternal(IteratorContext* ctx, std::vector<Tensor>* out_tensors,
                               bool* end_of_sequence) override {
    // Held through an on-the-spot production too: it serializes concurrent
    // GetNext calls, and the producers are stopped then, so they do not wait.
    mutex_lock lock(mu_);
    *end_of_sequence = exhausted_;
    if (exhausted_) return absl::OkStatus();
    TF_ASSIGN_OR_RETURN(const int64_t cursor, dataset()->cursor_.Read());
    TF_ASSIGN_OR_RETURN(const int64_t world_size, dataset()->world_size_.Read());
    TF_ASSIGN_OR_RETURN(const int64_t rank, dataset()->rank_.Read());
    const BatchKey key{cursor, world_size, rank};
    Prepared current;
    if (!dataset()->random_access_) {
      current.key = key;
      current.status = ReadStream(ctx, key, &current.end_of_sequence, &current.batch);
    } else if (!TakePrepared(ctx, key, lock, &current)) {
      // Nothing was prepared for this state (first batch, membership change,
      // rollback, restore): drop the look-ahead and cut the batch on the spot.
      StopLookahead(lock);
      EnsureProducers(ctx);
      current.key = key;
      current.status = ReadIndexed(ctx, kNotAbortable, producers_[0].get(), key,
                                   &current.end_of_sequence, &current.batch);
      if (current.status.ok() && !current.end_of_sequence) StartLookahead(key);
    }
    // Nothing is prepared past an error or the end of the pass.
    if (!current.status.ok() || current.end_of_sequence) StopLookahead(lock);
    TF_RETURN_IF_ERROR(current.status);
    if (current.end_of_sequence) {
      if (cursor == 0) {
        return tensorflow::errors::InvalidArgument(
            "The input of the elastic dataset has no global batch: it is empty",
            dataset()->drop_remainder_
                ? tensorflow::strings::StrCat(", or has fewer than global_batch_size (",
                                              dataset()->global_batch_size_,
                                              ") elements and drop_remainder is set")
                : "");
      }
      // The next pass starts at global batch 0; this iterator stays at its end.
      exhausted_ = true;
      dataset()->cursor_.Write(0);
      *end_of_sequence = true;
      return absl::OkStatus();
    }
    *out_tensors = std::move(current.batch);
    dataset()->cursor_.Write(cursor + 1);
    *end_of_sequence = false;
    return absl::OkStatus();
  }

 protected:
  std::shared_ptr<tensorflow::data::model::Node> CreateNode(
      IteratorContext* ctx, tensorflow::data::model::Node::Args args) const override {
    return tensorflow::data::model::MakeAsyncUnknownRatioNode(std::move(args), {});
  }

  absl::Status SaveInternal(SerializationContext* ctx, IteratorStateWriter* writer) override {
    mutex_lock lock(mu_);
    StopLookahead(lock);
    TF_ASSIGN_OR_RETURN(const int64_t cursor, dataset()->cursor_.Read());
    TF_RETURN_IF_ERROR(
        writer->WriteScalar(prefix(), kGlobalBatchSize, dataset()->global_batch_size_));
    TF_RETURN_IF_ERROR(
        writer->WriteScalar(prefix(), kInputCardinality, dataset()->input_cardinality_));
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kCursor, cursor));
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kExhausted, exhausted_ ? 1 : 0));
    // An indexed input is re-created at the cursor on demand; only a stream's
    // position is worth keeping.
    const bool keep_input = !dataset()->random_access_ && input_impl_ != nullptr;
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kInputImplEmpty, keep_input ? 0 : 1));
    if (keep_input) {
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kStreamPosition, stream_position_));
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kInputExhausted, input_exhausted_ ? 1 : 0));
      TF_RETURN_IF_ERROR(SaveInput(ctx, writer, input_impl_));
    }
    return absl::OkStatus();
  }

  absl::Status RestoreInternal(IteratorContext* ctx, IteratorStateReader* reader) override {
    mutex_lock lock(mu_);
    StopLookahead(lock);
    int64_t global_batch_size = 0;
    int64_t input_cardinality = 0;
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kGlobalBatchSize, &global_batch_size));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputCardinality, &input_cardinality));
    if (global_batch_size != dataset()->global_batch_size_) {
      return tensorflow::errors::FailedPrecondition(
          "Cannot restore an elastic input iterator saved with global_batch_size=",
          global_batch_size, " into a pipeline with global_batch_size=",
          dataset()->global_batch_size_, ": the cursor counts global batches of the saved size");
    }
    if (input_cardinality != dataset()->input_cardinality_) {
      return tensorflow::errors::FailedPrecondition(
          "Cannot restore an elastic input iterator saved over an input of ",
          input_cardinality, " elements into a pipeline whose input has ",
          dataset()->input_cardinality_, " (negative: infinite or unknown): it is another input");
    }
    int64_t cursor = 0;
    int64_t exhausted = 0;
    int64_t input_empty = 1;
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kCursor, &cursor));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kExhausted, &exhausted));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputImplEmpty, &input_empty));
    exhausted_ = exhausted != 0;
    input_impl_.reset();
    stream_position_ = 0;
    input_exhausted_ = false;
    if (input_empty == 0 && !dataset()->random_access_) {
      int64_t input_exhausted = 0;
      TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kStreamPosition, &stream_position_));
      TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputExhausted, &input_exhausted));
      input_exhausted_ = input_exhausted != 0;
      TF_RETURN_IF_ERROR(dataset()->input_->MakeIterator(ctx, this, prefix(), &input_impl_));
      TF_RETURN_IF_ERROR(RestoreInput(ctx, reader, input_impl_));
    }
    dataset()->cursor_.Write(cursor);
    return absl::OkStatus();
  }

 private:
  // The state a batch is cut for.
  struct BatchKey {
    int64_t cursor = -1;
    int64_t world_size = 0;
    int64_t rank = 0;
  };

  // One batch, ready to hand out.
  struct Prepared {
    BatchKey key;
    absl::Status status;
    bool end_of_sequence = false;
    std::vector<Tensor> batch;
  };

  // Which slices an indexed input iterator yields: those of global batches
  // next_cursor, next_cursor + stride, ... for (world_size, rank).
  struct Mapping {
    int64_t next_cursor = -1;
    int64_t world_size = 0;
    int64_t rank = 0;
  };

  // A reader of an indexed input. Producer k of n prepares the global
  // batches base + k, base + k + n, ... of the look-ahead (producer 0 also
  // cuts GetNext's on-the-spot batches), each with its own input iterator, so
  // n batches are cut in parallel and each is stacked by one thread.
  struct Producer {
    int64_t next = -1;  // the next cursor it prepares; guarded by mu_
    // Used by its own thread while it produces, by GetNext only while every
    // producer is stopped.
    std::unique_ptr<IteratorBase> input;
    Mapping mapping;
    IndexMapperFn index_mapper;
    std::unique_ptr<tensorflow::Thread> thread;
  };

  // Stacks elements into batch tensors allocated at the first element: one
  // copy per component per element, no list of elements kept.
  class BatchBuilder {
   public:
    BatchBuilder(const Dataset* dataset, IteratorContext* ctx, int64_t capacity)
        : dataset_(dataset), allocator_(ctx->allocator({})), capacity_(capacity) {}

    absl::Status Add(const std::vector<Tensor>& element) {
      if (rows_ == 0) {
        for (const Tensor& value : element) {
          TensorShape batch_shape = value.shape();
          batch_shape.InsertDim(0, capacity_);
          batch_.emplace_back(allocator_, value.dtype(), batch_shape);
        }
      }
      for (size_t component = 0; component < element.size(); ++component) {
        const Tensor& value = element[component];
        if (!SameRowShape(value, batch_[component])) {
          TensorShape row_shape = batch_[component].shape();
          row_shape.RemoveDim(0);
          return tensorflow::errors::InvalidArgument(
              "Cannot batch elements of different shapes: component ", component,
              " has shape ", row_shape.DebugString(), " in the first element of the batch and ",
              value.shape().DebugString(), " in element ", rows_,
              "; pad or resize the elements before the elastic dataset");
        }
        TF_RETURN_IF_ERROR(
            tensorflow::batch_util::CopyElementToSlice(value, &batch_[component], rows_));
      }
      ++rows_;
      return absl::OkStatus();
    }

    // The first `rows` rows added; zero rows keep the element shape (unknown
    // dimensions become 0).
    std::vector<Tensor> Finish(int64_t rows) {
      if (rows == 0) {
        std::vector<Tensor> empty;
        const DataTypeVector& dtypes = dataset_->output_dtypes();
        for (size_t component = 0; component < dtypes.size(); ++component) {
          TensorShape batch_shape({0});
          for (int64_t dim : dataset_->input_->output_shapes()[component].dim_sizes()) {
            batch_shape.AddDim(std::max<int64_t>(dim, 0));
          }
          empty.emplace_back(allocator_, dtypes[component], batch_shape);
        }
        return empty;
      }
      if (rows < capacity_) {  // a clipped last batch only
        for (Tensor& batch : batch_) batch = tensorflow::tensor::DeepCopy(batch.Slice(0, rows));
      }
      return std::move(batch_);
    }

   private:
    static bool SameRowShape(const Tensor& value, const Tensor& batch) {
      if (value.dims() + 1 != batch.dims()) return false;
      for (int dim = 0; dim < value.dims(); ++dim) {
        if (value.dim_size(dim) != batch.dim_size(dim + 1)) return false;
      }
      return true;
    }

    const Dataset* const dataset_;
    tensorflow::Allocator* const allocator_;
    const int64_t capacity_;
    int64_t rows_ = 0;
    std::vector<Tensor> batch_;
  };

  // Hands out the batch the look-ahead prepared for `key`, waiting for it if
  // it is in production. False if the look-ahead is not preparing it: a
  // prepared batch counts only if it was cut for exactly the state read at
  // hand-out, which is what makes the look-ahead safe.
  bool TakePrepared(IteratorContext* ctx, const BatchKey& key, mutex_lock& lock,
                    Prepared* out) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!lookahead_active_ || key.cursor != next_hand_out_ ||
        key.world_size != lookahead_world_size_ || key.rank != lookahead_rank_) {
      return false;
    }
    auto ready = ready_.find(key.cursor);
    if (ready == ready_.end()) {
      // Waiting is not this node's work (autotune would count it otherwise).
      RecordStop(ctx);
      const int64_t generation = generation_;
      while (!cancelled_ && generation == generation_ &&
             (ready = ready_.find(key.cursor)) == ready_.end()) {
        changed_.wait(lock);
      }
      RecordStart(ctx);
      if (ready == ready_.end()) return false;
    }
    *out = std::move(ready->second);
    ready_.erase(ready);
    ++next_hand_out_;
    changed_.notify_all();
    return true;
  }

  void EnsureProducers(IteratorContext* ctx) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!producers_.empty()) return;
    lookahead_ctx_ = std::make_unique<IteratorContext>(*ctx);
    // As many as tf.data's thread pool has threads (its private pool if the
    // options set one), and never more batches ahead than producers need.
    const int64_t count = std::max(1, ctx->runner_threadpool_size());
    window_ = std::max<int64_t>(kMinLookaheadBatches, count);
    for (int64_t i = 0; i < count; ++i) producers_.push_back(std::make_unique<Producer>());
  }

  // Prepares the global batches after `current` for its membership, while the
  // training step runs.
  void StartLookahead(const BatchKey& current) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t count = static_cast<int64_t>(producers_.size());
    lookahead_active_ = true;
    lookahead_world_size_ = current.world_size;
    lookahead_rank_ = current.rank;
    next_hand_out_ = current.cursor + 1;
    // Producer 0 has just cut `current`, so its input continues at current + count.
    for (int64_t i = 0; i < count; ++i) {
      producers_[i]->next = current.cursor + (i == 0 ? count : i);
    }
    if (producers_[0]->thread == nullptr) {
      for (std::unique_ptr<Producer>& producer : producers_) {
        Producer* raw = producer.get();
        producer->thread = lookahead_ctx_->StartThread("elastic_batch_lookahead",
                                                       [this, raw]() { ProducerLoop(raw); });
      }
    }
    changed_.notify_all();
  }

  // Drops what was prepared and waits for running productions to give up,
  // after which GetNext owns every producer's input.
  void StopLookahead(mutex_lock& lock) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++generation_;
    lookahead_active_ = false;
    ready_.clear();
    while (producing_ > 0) changed_.wait(lock);
  }

  void ProducerLoop(Producer* producer) {
    IteratorContext* ctx = lookahead_ctx_.get();
    while (true) {
      Prepared prepared;
      int64_t generation = 0;
      {
        mutex_lock lock(mu_);
        while (!cancelled_ &&
               !(lookahead_active_ && producer->next < next_hand_out_ + window_)) {
          changed_.wait(lock);
        }
        if (cancelled_) return;
        prepared.key = BatchKey{producer->next, lookahead_world_size_, lookahead_rank_};
        generation = generation_;
        ++producing_;
      }
      RecordStart(ctx);
      prepared.status = ReadIndexed(ctx, generation, producer, prepared.key,
                                    &prepared.end_of_sequence, &prepared.batch);
      RecordStop(ctx);
      mutex_lock lock(mu_);
      --producing_;
      if (generation == generation_) {
        const int64_t cursor = prepared.key.cursor;
        const bool last = !prepared.status.ok() || prepared.end_of_sequence;
        ready_.emplace(cursor, std::move(prepared));
        // Nothing follows an error or the end of the pass: park the producer.
        producer->next = last ? std::numeric_limits<int64_t>::max()
                              : cursor + static_cast<int64_t>(producers_.size());
      }
      changed_.notify_all();
    }
  }

  // Indexed input: the producer's input iterator has an index mapper that
  // yields this worker's slices of the producer's global batches. It is
  // re-created (O(1), no replay) when the cursor jumps or the membership
  // changes; anything it prefetched for the old mapping goes with it.
  absl::Status ReadIndexed(IteratorContext* ctx, int64_t generation, Producer* producer,
                           const BatchKey& key, bool* end_of_sequence,
                           std::vector<Tensor>* out_tensors) {
    const int64_t global_batch_size = dataset()->global_batch_size_;
    BatchSlice full;
    TF_RETURN_IF_ERROR(ComputeReplicaRangeSlice(key.cursor, global_batch_size, key.world_size,
                                                key.rank, dataset()->local_replicas_, &full));
    const WorkerBatch batch = PlanWorkerBatch(
        full, key.cursor, global_batch_size,
        dataset()->input_cardinality_ - key.cursor * global_batch_size,
        dataset()->drop_remainder_);
    *end_of_sequence = batch.end_of_sequence;
    if (batch.end_of_sequence) return absl::OkStatus();
    BatchBuilder builder(dataset(), ctx, batch.size);
    if (batch.size == 0) {
      *out_tensors = builder.Finish(0);
      return absl::OkStatus();
    }
    Mapping& mapping = producer->mapping;
    if (producer->input == nullptr || mapping.next_cursor != key.cursor ||
        mapping.world_size != key.world_size || mapping.rank != key.rank) {
      const int64_t first = key.cursor;
      const int64_t stride = static_cast<int64_t>(producers_.size());
      const int64_t offset = full.start - key.cursor * global_batch_size;
      const int64_t size = full.size;
      const int64_t cardinality = dataset()->input_cardinality_;
      producer->index_mapper = [first, stride, global_batch_size, offset, size,
                                cardinality](size_t k) -> absl::StatusOr<size_t> {
        const int64_t index = SliceStreamIndex(static_cast<int64_t>(k), first, stride,
                                               global_batch_size, offset, size);
        if (index >= cardinality) return absl::OutOfRangeError("past the end of the input");
        return static_cast<size_t>(index);
      };
      IteratorContext mapped_ctx = WithIndexMapper(ctx, producer->index_mapper);
      TF_RETURN_IF_ERROR(
          dataset()->input_->MakeIterator(&mapped_ctx, this, prefix(), &producer->input));
      mapping = Mapping{key.cursor, key.world_size, key.rank};
    }
    IteratorContext mapped_ctx = WithIndexMapper(ctx, producer->index_mapper);
    // Until the slice is complete the input is mid-slice: re-create it next time.
    mapping.next_cursor = -1;
    std::vector<Tensor> element;
    for (int64_t row = 0; row < batch.size; ++row) {
      if (generation != kNotAbortable && generation != generation_.load()) {
        return absl::CancelledError("superseded by a membership change or a rollback");
      }
      bool end_of_input = false;
      element.clear();
      TF_RETURN_IF_ERROR(producer->input->GetNext(&mapped_ctx, &element, &end_of_input));
      if (end_of_input) {
        return tensorflow::errors::Internal("The elastic dataset's input ended before its ",
                                            dataset()->input_cardinality_, " elements");
      }
      TF_RETURN_IF_ERROR(builder.Add(element));
    }
    // A clipped last batch breaks the mapping's rhythm; the pass ends next anyway.
    if (batch.size == full.size) {
      mapping.next_cursor = key.cursor + static_cast<int64_t>(producers_.size());
    }
    *out_tensors = builder.Finish(batch.size);
    return absl::OkStatus();
  }

  static IteratorContext WithIndexMapper(IteratorContext* ctx, const IndexMapperFn& mapper) {
    IteratorContext::Params params(ctx);
    params.index_mapper = mapper;
    return IteratorContext(std::move(params));
  }

  // Streaming input: every worker reads the whole stream in order and keeps
  // its slice, like ShardDataset. Reading through to the end of the global
  // batch tells each worker how many elements it has, hence the same plan on
  // every worker. Only a jump back (rollback) re-creates the input and skips
  // forward: that fast-forward is O(cursor) for a stream.
  absl::Status ReadStream(IteratorContext* ctx, const BatchKey& key, bool* end_of_sequence,
                          std::vector<Tensor>* out_tensors) {
    BatchSlice full;
    TF_RETURN_IF_ERROR(ComputeReplicaRangeSlice(key.cursor, dataset()->global_batch_size_,
                                                key.world_size, key.rank,
                                                dataset()->local_replicas_, &full));
    const int64_t batch_start = key.cursor * dataset()->global_batch_size_;
    if (input_impl_ == nullptr || stream_position_ > full.start) {
      TF_RETURN_IF_ERROR(dataset()->input_->MakeIterator(ctx, this, prefix(), &input_impl_));
      stream_position_ = 0;
      input_exhausted_ = false;
    }
    TF_RETURN_IF_ERROR(SkipTo(ctx, full.start));
    BatchBuilder builder(dataset(), ctx, full.size);
    std::vector<Tensor> element;
    while (stream_position_ < full.start + full.size && !input_exhausted_) {
      element.clear();
      TF_RETURN_IF_ERROR(input_impl_->GetNext(ctx, &element, &input_exhausted_));
      if (input_exhausted_) break;
      TF_RETURN_IF_ERROR(builder.Add(element));
      ++stream_position_;
    }
    TF_RETURN_IF_ERROR(SkipTo(ctx, batch_start + dataset()->global_batch_size_));
    const WorkerBatch batch =
        PlanWorkerBatch(full, key.cursor, dataset()->global_batch_size_,
                        stream_position_ - batch_start, dataset()->drop_remainder_);
    *end_of_sequence = batch.end_of_sequence;
    if (!batch.end_of_sequence) *out_tensors = builder.Finish(batch.size);
    return absl::OkStatus();
  }

  absl::Status SkipTo(IteratorContext* ctx, int64_t target) {
    while (stream_position_ < target && !input_exhausted_) {
      const int chunk = static_cast<int>(
          std::min<int64_t>(target - stream_position_, std::numeric_limits<int>::max()));
      int skipped = 0;
      TF_RETURN_IF_ERROR(input_impl_->Skip(ctx, chunk, &input_exhausted_, &skipped));
      stream_position_ += skipped;
    }
    return absl::OkStatus();
  }

  mutex mu_;
  tensorflow::condition_variable changed_;
  bool cancelled_ TF_GUARDED_BY(mu_) = false;
  bool exhausted_ TF_GUARDED_BY(mu_) = false;
  // The look-ahead: batches next_hand_out_ .. next_hand_out_ + window_ - 1 of
  // one membership, prepared by the producers; ready_ holds the finished ones.
  bool lookahead_active_ TF_GUARDED_BY(mu_) = false;
  int64_t lookahead_world_size_ TF_GUARDED_BY(mu_) = 0;
  int64_t lookahead_rank_ TF_GUARDED_BY(mu_) = 0;
  int64_t next_hand_out_ TF_GUARDED_BY(mu_) = -1;
  int64_t window_ = kMinLookaheadBatches;
  absl::flat_hash_map<int64_t, Prepared> ready_ TF_GUARDED_BY(mu_);
  int64_t producing_ TF_GUARDED_BY(mu_) = 0;
  // Bumped under mu_ to supersede the look-ahead; read without it by a
  // production checking whether to give up.
  std::atomic<int64_t> generation_{0};
  std::unique_ptr<IteratorContext> lookahead_ctx_;
  std::vector<std::unique_ptr<Producer>> producers_;
  // The stream's reader, used by GetNext only.
  std::unique_ptr<IteratorBase> input_impl_;
  int64_t stream_position_ = 0;
  bool input_exhausted_ = false;
};

std::unique_ptr<IteratorBase> ElasticBatchDatasetOp::Dataset::MakeIteratorInternal(
    const std::string& prefix) const {
  return std::make_unique<Iterator>(
      Iterator::Params{this, tensorflow::strings::StrCat(prefix, "::", kDatasetType)});
}

void ElasticBatchDatasetOp::MakeDataset(OpKernelContext* ctx, DatasetBase* input,
                                        DatasetBase** output) {
  int64_t global_batch_size = 0;
  OP_REQUIRES_OK(ctx, tensorflow::data::ParseScalarArgument<int64_t>(ctx, kGlobalBatchSize,
                                                                      &global_batch_size));
  OP_REQUIRES(ctx, global_batch_size > 0,
              tensorflow::errors::InvalidArgument("global_batch_size must be positive, got ",
                                                  global_batch_size));
  OP_REQUIRES(ctx, input->Cardinality() != 0,
              tensorflow::errors::InvalidArgument("The input of the elastic dataset is empty"));
  StateVariable world_size;
  StateVariable rank;
  StateVariable cursor;
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 2, "world_size", &world_size));
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 3, "rank", &rank));
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 4, "cursor", &cursor));
  *output = new Dataset(ctx, input, global_batch_size, drop_remainder_, local_replicas_,
                        std::move(world_size), std::move(rank), std::move(cursor));
}

REGISTER_KERNEL_BUILDER(Name("ElasticBatchDataset").Device(tensorflow::DEVICE_CPU),
                        ElasticBatchDatasetOp);

}  // namespace
}  // namespace tensorflow_elastic
